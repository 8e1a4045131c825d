"""The sandbox for model-written code: every program a policy wrote (a code verifier's solution, a tool call) runs
here, in a view of the filesystem the operating system builds for it (`view`), as processes that end with the item
(`process`); `run` is the plain-data entry point, `host` says whether this machine can isolate, `sweep` removes what
a crashed earlier run left. docs/verifiers.md, "The sandbox", has the threat model."""
