"""`draftgraph serve`: an OpenAI-compatible HTTP server over one `SpecDecodeEngine`.

`routes` (the Starlette app), `bridge` (the stepping thread and the streams), `validation`
(request bodies), `text` (chat prompts, stop strings), `admin` (reload, profile, access),
`metrics` (HTTP figures), `state`, `config`, `server` (uvicorn, drain). docs/serving.md.
"""

from __future__ import annotations

from .bridge import EngineBridge, QueueFull, Stream
from .config import ServeConfig
from .routes import build_app
from .server import bind_socket, run_server
from .state import ServeState

__all__ = ["EngineBridge", "QueueFull", "ServeConfig", "ServeState", "Stream", "bind_socket", "build_app",
           "run_server"]
