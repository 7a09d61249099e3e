"""One place where command-line flags meet a profile: flag, then profile, then built-in default."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Optional, Union

from dflash_tui.core.profiles import DEFAULT_PROFILE, Profile, load_profile
from dflash_tui.engines import EngineConfig, GenerationRequest, choose_engine
from dflash_tui.engines.errors import UserError
from dflash_tui.engines.text import printable


def load_settings(profile: Optional[str], engine: Optional[str] = None, target: Optional[str] = None,
                  draft: Optional[str] = None, **flags) -> tuple[Profile, EngineConfig]:
    """The profile (with [engines.<name>] overrides applied) and the EngineConfig to load.

    `--target` without `--profile` runs that checkpoint alone (with `--draft`, as a pair) instead of
    the default profile. `flags` are EngineConfig fields; None means "not given".
    """
    base = with_pair(profile, target, draft)
    refuse_model_without_url(base, flags.get("url"), flags.get("model"))
    chosen = choose_engine(engine or base.engine)
    resolved = base.resolved(chosen)
    return resolved, resolved.engine_config(chosen, **flags)


def with_pair(profile: Union[str, Profile, None], target: Optional[str] = None, draft: Optional[str] = None) -> Profile:
    """The profile with `--target`/`--draft` over its pair. `--target` without a profile runs that
    checkpoint alone (with `--draft`, as a pair) instead of the default profile. With a profile it replaces
    the pair: the profile's draft was trained for its own target, so it goes unless `--draft` names one,
    and with it the profile's block size (a target alone runs block 1). The flags win over the
    `[engines.*]` tables too, which would otherwise put the profile's checkpoints back."""
    if profile is None and target is not None:
        return Profile(name="command line", description="", path=None, target=target, draft=draft)
    base = profile_for(profile)
    if target is None and draft is None:
        return base
    replaced = ("target", "draft", "block_size") if target is not None else ("draft",)
    engines = {name: {k: v for k, v in table.items() if k not in replaced} for name, table in base.engines.items()}
    if target is None:
        return replace(base, draft=draft, engines=engines)
    return replace(base, target=target, draft=draft, engines=engines,
                   block_size=base.block_size if draft is not None else 1)


def generation_request(profile: Profile, **given) -> GenerationRequest:
    """A request whose unset fields (None) take the profile's values."""
    values = {"max_new_tokens": profile.max_new_tokens, **profile.sampling(), "thinking": profile.thinking,
              "reasoning_effort": profile.reasoning_effort}
    values.update({k: v for k, v in given.items() if v is not None})
    return GenerationRequest(**values)


def refuse_model_without_url(profile: Profile, url: Optional[str], model: Optional[str]) -> None:
    """`--model` names a model on a server: without a server to ask (neither --url nor the profile's remote
    url) it would be silently dropped and the local pair would answer instead, so it is refused."""
    if model is not None and not url and not profile.resolved("remote").url:
        raise UserError(printable(f"--model {model!r} names a model on a server, but no server is given; add --url "
                        "http://HOST:PORT/v1 (or a profile whose [engines.remote] has a url), or drop --model."))


def with_remote(profile: Profile, url: Optional[str] = None, model: Optional[str] = None,
                api_key: Optional[str] = None) -> Profile:
    """The profile with the remote engine's command-line flags (None: not given) over its [engines.remote]."""
    refuse_model_without_url(profile, url, model)
    given = {k: v for k, v in (("url", url), ("model", model), ("api_key", api_key)) if v is not None}
    if not given:
        return profile
    return replace(profile, engines={**profile.engines, "remote": {**profile.engines.get("remote", {}), **given}})


def server_text(config: EngineConfig) -> Optional[str]:
    """'http://HOST:PORT/v1 (model M)' for the remote engine (the model: the server's first when not
    given); None for an engine that loads weights here."""
    if config.engine != "remote":
        return None
    return f"{config.url or '(no --url)'} (model {config.model or 'the first it lists'})"


def loading_line(config: EngineConfig) -> str:
    """What starting `config` does, in words: the local pair it loads, or the server it connects to (the
    remote engine loads nothing here)."""
    server = server_text(config)
    if server is not None:
        return f"connecting to {server}"
    return f"loading {config.target}" + (f" + {config.draft}" if config.draft else "")


def profile_for(ref: Union[str, os.PathLike, Profile, None]) -> Profile:
    """A Profile from a name, a path, or a Profile itself (None: the default profile)."""
    if isinstance(ref, Profile):
        return ref
    return load_profile(str(ref) if ref is not None else DEFAULT_PROFILE)
