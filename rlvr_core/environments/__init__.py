"""Environments: what a policy talks to over one or more turns. `trajectory` holds a rollout as segments of token
ids (the model's, with their log-probs, and the environment's), never as text; `base` is the interface and its
registry; `boundary` renders an observation as the ids that follow the model's sampled ids, per template family;
`tools` parse a tool call from the model's turn and answer it (`calculator`, `python` through the sandbox);
`loop` runs an engine and an environment to the end of each trajectory; `checks` are the guards of that path.
docs/environments.md has the design."""
