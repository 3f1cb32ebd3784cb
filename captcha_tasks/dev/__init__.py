"""Development tooling: the sandbox API, local process stacks, the quickstart, a Kafka broker."""
