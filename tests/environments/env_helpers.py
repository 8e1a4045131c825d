"""A tiny model and tokenizer for the environment tests (built from configs, nothing downloaded), a tool template,
and engines that plant the bugs the guards exist for."""

from __future__ import annotations

from dataclasses import replace

import torch

from rlvr_core.data.templates import PromptTemplate
from rlvr_core.sampling.hf import HFEngine
from rlvr_core.tiny.model import build_tiny_model
from rlvr_core.tiny.tokenizer import train_tokenizer

CORPUS = [
    "Question: What is 12 * 34?\nAnswer: <calculator>12*34</calculator>\n= 408\n#### 408",
    "Question: Tom has 3 apples and buys 4 more. How many?\nAnswer: 3 + 4 = 7\n#### 7",
    "Question: What is 7 * 8?\nAnswer: <calculator>7*8</calculator>\n= 56\n#### 56",
    "<python>print(2 + 2)</python>\n= 4\n",
] * 30

TOOL_QA = PromptTemplate(id="tool_qa_test", version="1", kind="base", pattern="Question: {question}\nAnswer:",
                         stop=("\nQuestion:",), answer_hint="#### N")


def tiny_engine(seed: int = 0) -> HFEngine:
    torch.set_num_threads(1)
    tokenizer = train_tokenizer(CORPUS, vocab_size=320)
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, heads=2, seed=seed)
    with torch.no_grad():  # sharper logits than the init's, so greedy turns end on a stop now and then
        model.model.embed_tokens.weight.mul_(4.0)
    return HFEngine(model, tokenizer, add_special_tokens=False)


class ReencodingEngine:
    """The bug of TRL #5224 planted: each later turn's context is decoded to text and encoded again."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine = engine

    def generate_ids(self, contexts, ids, params, **kw):
        tok = self.engine.tokenizer
        again = [tok(tok.decode(c), add_special_tokens=False)["input_ids"] for c in contexts]
        return self.engine.generate_ids(again, ids, params, **kw)


class DroppingEngine:
    """verl #6501 planted: the turn separator (the observation's first id) never reaches the engine, while the
    stored trajectory, and so the trainer, has it."""

    def __init__(self, engine: HFEngine, separator: int) -> None:
        self.engine, self.separator = engine, separator

    def generate_ids(self, contexts, ids, params, **kw):
        return self.engine.generate_ids([[t for t in c if t != self.separator] for c in contexts], ids, params, **kw)


def trained_engine(steps: int = 150, seed: int = 0) -> HFEngine:
    """The tiny model taught the corpus (a few seconds of AdamW on the CPU), so that it calls the calculator."""
    engine = tiny_engine(seed)
    teach(engine.model, engine.tokenizer, steps=steps, seed=seed)
    return engine


def teach(model, tok, *, steps: int, seed: int) -> None:
    """Full-batch AdamW on the corpus's first four texts (each ending in eos); the model is left in eval mode."""
    rows = [tok(t + tok.eos_token, add_special_tokens=False)["input_ids"] for t in CORPUS[:4]]
    width = max(map(len, rows))
    batch = torch.full((len(rows), width), tok.pad_token_id)
    for i, r in enumerate(rows):
        batch[i, :len(r)] = torch.tensor(r)
    labels = batch.masked_fill(batch == tok.pad_token_id, -100)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _ in range(steps):
            loss = model(input_ids=batch, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
