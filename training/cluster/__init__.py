"""Ray placement: rollout workers, env actors and trainer ranks as Ray actors, restarted on failure."""
