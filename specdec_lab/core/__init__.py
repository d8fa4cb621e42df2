"""The core: the decoder, the cache, sampling, verification and the loop. torch and the standard
library only; nothing else of the package (import-linter checks it)."""
