"""`ServeConfig`: what `draftgraph serve` was started with (frozen, checked at construction)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .connections import ConnectionLimits

__all__ = ["ServeConfig", "MAX_BODY_BYTES"]

MAX_BODY_BYTES = 1 << 20  # a request body past 1 MiB is refused unread (400)


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r}: must be an int >= {low}")


@dataclass(frozen=True)
class ServeConfig:
    """The server's settings (the CLI flags of `serve`).

    ``max_waiting``: requests queued beyond the running batch before new ones get 429;
    ``max_tokens_limit``: the largest ``max_tokens`` a request may ask for; ``drain_s``: how long
    SIGTERM lets in-flight requests finish; ``admin_token``: the bearer token admin routes take
    from a caller that is not on loopback (None: loopback callers only); ``reload_config``: the
    file SIGHUP reloads from; ``profile_dir``: where `POST /admin/profile` writes its traces; ``limits``: the
    connections' deadlines and cap, and the proxy trusted to name its clients
    (`ConnectionLimits`); ``sampling_defaults``: (field, value) pairs a request's left-out sampling
    fields take (the model's generation_config.json; `sampling_fields.generation_defaults`)."""

    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "draftgraph-default"
    max_waiting: int = 64
    max_tokens_limit: int = 256
    drain_s: float = 30.0
    admin_token: str | None = field(default=None, repr=False)  # never in a log line
    reload_config: str | None = None
    profile_dir: str | None = None
    retry_after_s: int = 1
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    sampling_defaults: tuple[tuple[str, float | int], ...] = ()

    def __post_init__(self) -> None:
        _check_int("port", self.port, 0)
        if self.port > 65535:
            raise ValueError(f"port={self.port}: must be in 0..65535 (0: a free port)")
        _check_int("max_waiting", self.max_waiting, 0)
        _check_int("max_tokens_limit", self.max_tokens_limit, 1)
        _check_int("retry_after_s", self.retry_after_s, 1)
        if isinstance(self.drain_s, bool) or not isinstance(self.drain_s, (int, float)) or not self.drain_s >= 0:
            raise ValueError(f"drain_s={self.drain_s!r}: must be a number >= 0 (seconds)")
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host={self.host!r}: must be a host name or an IP address")
        if self.admin_token is not None and (not isinstance(self.admin_token, str) or len(self.admin_token) < 16):
            raise ValueError("admin_token: must be a string of at least 16 characters")
