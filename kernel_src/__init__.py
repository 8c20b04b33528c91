"""TileLang kernel definitions for tile-kernels-aot. Build time only: the runtime never imports this."""
