"""`RouterState`: the parts one router app shares across requests (built in the lifespan)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request
from tokenizers import Tokenizer

from slimeish.router.config import RouterConfig
from slimeish.router.engine_pool import EnginePool
from slimeish.router.metrics import RouterMetrics
from slimeish.router.reasoning import ReasoningSigner
from slimeish.router.renderers.base import Renderer
from slimeish.router.sessions import SessionRegistry
from slimeish.router.storage import TurnStore
from slimeish.router.turns import TurnRunner


@dataclass
class RouterState:
    config: RouterConfig
    renderer: Renderer
    sessions: SessionRegistry
    pool: EnginePool
    store: TurnStore
    runner: TurnRunner
    metrics: RouterMetrics
    model_name: str
    context_length: int
    token_chars: int  # the most characters one token spells (`limits.max_token_chars`)
    tokenizer: Tokenizer | None  # the Rust tokenizer, to count a large prompt's tokens off the loop
    signer: ReasoningSigner = field(default_factory=ReasoningSigner)  # thinking signatures, per router


def get_state(request: Request) -> RouterState:
    state: RouterState = request.app.state.router
    return state
