"""The RL core: the trainer loop, the policy update, losses, advantages in and batches out."""
