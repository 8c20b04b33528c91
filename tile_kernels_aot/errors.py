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


class ArtifactError(TileKernelsAOTError):
    """An installed artifact (a manifest, a cubin, an arch package or a kernel folder) is missing or damaged.

    Every subclass carries ``package`` (where the artifact comes from: the arch package's distribution, or the
    ``TILE_KERNELS_AOT_KERNEL_DIRS`` folder it was found in) and ``file`` (the path, or None), so that a caller
    can report or repair the install without parsing the message."""

    def __init__(self, message: str, *, package: str | None, file: str | None) -> None:
        self.package, self.file = package, None if file is None else str(file)
        TileKernelsAOTError.__init__(self, message)  # not super(): in CubinLoadError the next class is CudaDriverError


class ManifestError(ArtifactError, ValueError):
    """A manifest.json is missing, truncated or malformed. ``reason`` is 'missing', 'truncated', 'malformed' or
    'schema'; ``detail`` says what is wrong where. Also a ValueError, for callers that catch that."""

    def __init__(self, reason: str, detail: str, *, package: str | None = None, file: str | None = None) -> None:
        self.reason, self.detail = reason, detail
        where = f'{file}' if file is not None else 'manifest'
        origin = f' (arch package {package})' if package else ''
        super().__init__(f'{where}{origin}: {detail}; reinstall or rebuild the arch package', package=package, file=file)


class ManifestSchemaError(ManifestError):
    """A manifest of a schema version this runtime does not read. Carries ``expected_schema`` and ``found_schema``."""

    def __init__(self, expected_schema: int, found_schema: object, *, package: str | None = None, file: str | None = None) -> None:
        self.expected_schema, self.found_schema = expected_schema, found_schema
        super().__init__('schema', f'manifest schema {found_schema!r} is not the supported schema {expected_schema}',
                         package=package, file=file)


class KernelDirError(ArtifactError, FileNotFoundError):
    """``TILE_KERNELS_AOT_KERNEL_DIRS`` names a folder that does not exist. Carries ``variable`` and ``file`` (the
    folder). Also a FileNotFoundError."""

    def __init__(self, variable: str, folder: str) -> None:
        self.variable = variable
        super().__init__(f'{variable} names {folder}, which is not a folder; fix or unset {variable}',
                         package=f'{variable} ({folder})', file=folder)


class ArchPackageMissingError(ArtifactError, UnsupportedDeviceError):
    """The arch package that serves this GPU is not installed. Carries ``target`` and ``package`` (the
    distribution to install); ``file`` is None. Also an UnsupportedDeviceError."""

    def __init__(self, target: str, distribution: str, device: str, capability: tuple[int, int], installed: Sequence[str],
                 reasons: Sequence[str], advice: str) -> None:
        self.target, self.package, self.file = target, distribution, None
        UnsupportedDeviceError.__init__(self, device, capability, installed, reasons, advice)


class KernelIntegrityError(ArtifactError):
    """An installed binary does not match its manifest: the install is damaged. Carries ``kernel`` (name[spec key]),
    ``package``, ``file``, ``target``, ``expected_sha256`` and ``found_sha256`` (None where not computed). The
    subclasses say which check failed."""

    def __init__(self, message: str, *, kernel: str, package: str | None, file: str, target: str,
                 expected_sha256: str, found_sha256: str | None = None) -> None:
        self.kernel, self.target = kernel, target
        self.expected_sha256, self.found_sha256 = expected_sha256, found_sha256
        super().__init__(f'{kernel}: {message}; reinstall or rebuild the arch package' + (f' ({package})' if package else ''),
                         package=package, file=file)


class CubinMissingError(KernelIntegrityError):
    """The cubin the manifest names cannot be read. ``detail`` is the OS error's text."""

    def __init__(self, detail: str, **fields) -> None:
        self.detail = detail
        super().__init__(f'cannot read {fields["file"]}: {detail}', **fields)


class CubinChecksumError(KernelIntegrityError):
    """The cubin's sha256 differs from the manifest's (truncated, flipped or replaced bytes)."""

    def __init__(self, size: int, **fields) -> None:
        self.size = size
        super().__init__(f'{fields["file"]}: sha256 does not match the manifest (expected {fields["expected_sha256"]}, '
                         f'found {fields["found_sha256"]} over {size} bytes)', **fields)


class CubinArchError(KernelIntegrityError):
    """The cubin is not a CUDA ELF file, or its ELF header names another SM than the manifest's target.
    ``found_sm`` is the SM it names, or None when it is no CUDA ELF at all; ``detail`` says which."""

    def __init__(self, found_sm: int | None, detail: str, **fields) -> None:
        self.found_sm, self.detail = found_sm, detail
        super().__init__(f'{fields["file"]}: {detail}', **fields)


class CubinTruncatedError(KernelIntegrityError):
    """The cubin's ELF tables or sections reach past its end (a truncated or malformed file), found before the driver
    sees it: with sha256 verification off, cuModuleLoadData may crash the process on such an image rather than refuse
    it. ``size`` is the file's length in bytes; ``detail`` says what reaches past it."""

    def __init__(self, size: int, detail: str, **fields) -> None:
        self.size, self.detail = size, detail
        super().__init__(f'{fields["file"]}: {detail}', **fields)


class CubinLoadError(KernelIntegrityError, CudaDriverError):
    """The driver refused the cubin (cuModuleLoadData) or its entry symbol (cuModuleGetFunction): with sha256
    verification off (TILE_KERNELS_AOT_VERIFY_SHA256=0) this is how a damaged cubin shows. Carries the file and
    the driver's ``function``, ``code``, ``name`` and ``text``. Also a CudaDriverError."""

    def __init__(self, driver_error: CudaDriverError, **fields) -> None:
        self.function, self.code, self.name, self.text = driver_error.function, driver_error.code, driver_error.name, driver_error.text
        KernelIntegrityError.__init__(self, f'the driver refused {fields["file"]}: {driver_error}', **fields)
