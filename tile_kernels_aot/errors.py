"""Exceptions raised by tile-kernels-aot. Bad arguments raise TypeError / ValueError naming the argument."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class TileKernelsAOTError(RuntimeError):
    """Base class of the errors below."""


class CudaDriverError(TileKernelsAOTError):
    """A CUDA driver call failed. Carries the function, the CUresult and the driver's error name."""

    def __init__(self, function: str, code: int, name: str, text: str) -> None:
        self.function, self.code, self.name, self.text = function, code, name, text
        super().__init__(f'{function} failed: {name} ({code}): {text}')


class UnsupportedDeviceError(TileKernelsAOTError):
    """No installed arch package has binaries that run on this GPU."""

    def __init__(self, device: str, capability: tuple[int, int], installed: Sequence[str], reasons: Sequence[str], advice: str) -> None:
        self.device, self.capability, self.installed = device, capability, list(installed)
        major, minor = capability
        lines = [
            f'no tile-kernels-aot binaries run on {device} (compute capability {major}.{minor}).',
            f'Installed arch packages: {", ".join(installed) if installed else "none"}.',
            *[f'  {r}' for r in reasons],
            advice,
        ]
        super().__init__('\n'.join(lines))


class SpecNotPrebuiltError(TileKernelsAOTError):
    """The call needs a kernel specialisation that no installed binary provides. tile-kernels-aot never
    compiles at run time; the message says how to build the missing spec."""

    def __init__(self, kernel: str, target: str, params: Mapping[str, object], nearest: Sequence[str], build_command: str, spec_json: str) -> None:
        self.kernel, self.target, self.params, self.nearest = kernel, target, dict(params), list(nearest)
        requested = ', '.join(f'{k}={v!r}' for k, v in params.items())
        lines = [
            f'{kernel} has no prebuilt {target} binary for {requested}.',
            'Nearest prebuilt specs: ' + ('; '.join(nearest) if nearest else 'none (the kernel is not in the installed package)'),
            'To add it, put this in a specs file and rebuild the wheels:',
            f'  {spec_json}',
            f'  {build_command}',
        ]
        super().__init__('\n'.join(lines))


class KernelIntegrityError(TileKernelsAOTError):
    """An installed binary does not match its manifest (sha256 or ELF arch): the install is damaged."""
