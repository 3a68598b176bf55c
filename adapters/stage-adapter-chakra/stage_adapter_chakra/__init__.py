"""Chakra execution-trace backends for STAGE.

``chakra`` writes Chakra ET v0.0.4 protobuf files (``trace.<rank>.et``) that
ASTRA-sim runs; ``chakra-json`` writes the same content in protobuf's JSON
mapping.  Both come with readers.  The message classes are built at import
time from the package's own ``et_def.proto`` (no generated code).
"""

from .errors import ChakraReadError, ChakraWriteError
from .et import write as write_et
from .etread import decode_et, read_et_file
from .jsonread import decode_json, read_json_file
from .jsontrace import write as write_json

__version__ = "0.1.0"
__all__ = [
    "ChakraReadError",
    "ChakraWriteError",
    "decode_et",
    "decode_json",
    "read_et_file",
    "read_json_file",
    "write_et",
    "write_json",
    "__version__",
]
