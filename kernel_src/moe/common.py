"""What several MoE kernels share."""

from kernel_src.decl import param

INDEX_DTYPES = ('int64', 'int32')  # expert / group index tensors, as torch gives them


def check_index_dtype(index_dtype: str) -> None:
    if index_dtype not in INDEX_DTYPES:
        raise ValueError(f'index_dtype must be one of {INDEX_DTYPES}, got {index_dtype!r}')


def index_dtype_specs() -> list[dict]:
    return [{'index_dtype': d} for d in INDEX_DTYPES]


INDEX_DTYPE_PARAMS = (param('index_dtype', 'str', ''),)  # the spec schema of kernels specialised on it alone
