"""The agent gateway: an OpenAI-compatible server in front of a sleuth policy that records every session's
calls as token-exact trajectories, so agents written against the OpenAI API evaluate and train unchanged."""

from sleuth.agents.gateway.recorder import Choice, Completion, ContextOverflow, Gateway, GatewayEpisode
from sleuth.agents.gateway.render import ChatFormat, MessageError
from sleuth.agents.gateway.server import create_app

__all__ = ["Gateway", "GatewayEpisode", "Completion", "Choice", "ContextOverflow", "ChatFormat", "MessageError",
           "create_app"]
