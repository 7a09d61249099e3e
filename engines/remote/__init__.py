"""The `remote` engine: the engine contract over any OpenAI-compatible server (httpx, framework-free).

`dflash serve` (dflash_tui.serve) is the server side; `engines.remote.wire` is the extension both share.
"""

from dflash_tui.engines.remote.client import Client, RemoteError
from dflash_tui.engines.remote.engine import RemoteConfig, RemoteEngine

__all__ = ["Client", "RemoteConfig", "RemoteEngine", "RemoteError"]
