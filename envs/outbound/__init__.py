"""Outbound forms: sleuth's tool envs in other libraries' APIs (an OpenEnv server, GEM's registry, a TRL
`environment_factory`). Each module imports its library, so each is imported only by whoever uses it; what they
share is `ToolSession`, which drives an env by tool calls with the env's own budget and verifier."""
