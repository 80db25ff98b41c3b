"""The workloads of ``bench/llm_peers.py``, as token ids both engines receive unchanged.

* ``labelling``: ``bench/llm.py``'s 64 review-labelling chats sharing one system prompt, ``max_tokens``
  1..48 each, all sent at once (prefill-heavy; the shared prefix is what a prefix cache saves).
* ``labelling-1``: the first quarter of those chats one at a time (a lightly loaded stream: each prompt's
  uncached part is computed alone).
* ``decode-<C>``: short distinct prompts, 192 new tokens each, ``C`` requests at once (a closed loop: a
  finished request is replaced by the next until all are done).
* ``extraction``: distinct ~500-token documents (a product page, a support thread...) with an instruction
  to extract fields, 64 new tokens each, 8 at once.

Every request ignores EOS and is greedy, so each engine produces exactly ``sum(max_tokens)`` tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from llm import build_workload

DECODE_TOPICS = ["a lighthouse keeper", "a lost umbrella", "the first snow", "a robot gardener", "an old map",
                 "a night train", "a street musician", "a quiet library", "a mountain village", "a broken clock",
                 "a dragon who bakes", "the last bus home", "a secret garden", "a ship in a bottle",
                 "a forgotten song", "a kite festival"]  # fmt: skip
_DOC_PARTS = [
    "The {p} arrived in a plain cardboard box with a printed invoice, order number {n}, and a warranty card.",
    "Customer {name} wrote on {day} that the {p} stopped charging after {k} days and asked for a replacement.",
    "Support replied that a courier would collect the {p} from {city} within three working days.",
    "The technician's report lists a faulty power board, a scratched housing and a missing rubber foot.",
    "A refund of {price} euros was approved by the team lead, pending the return of the original charger.",
    "The customer later added that the replacement {p} works, although the fan is louder than the first one.",
    "Internal note: the batch {n} has three similar complaints this month; quality control has been told.",
    "Delivery address: {name}, 12 Harbour Street, {city}; preferred contact by email, never by phone.",
]
_NAMES = ["Ana Silva", "Tom Berg", "Li Wei", "Sara Novak", "Omar Haddad", "Eva Lund", "Ravi Iyer", "Mia Rossi"]
_CITIES = ["Porto", "Uppsala", "Lyon", "Graz", "Leeds", "Bergen", "Gdansk", "Turin"]
EXTRACTION_INSTRUCTION = ("Extract from the document: the customer's name, the city, the product, the order number "
                          "and the refund amount. Answer in JSON with keys name, city, product, order, refund.")  # fmt: skip


@dataclass(frozen=True)
class Workload:
    name: str
    prompts: list[list[int]]
    max_tokens: list[int]
    concurrency: int  # requests in flight at once (a closed loop); len(prompts) = all at once

    @property
    def num_output_tokens(self) -> int:
        return sum(self.max_tokens)

    @property
    def max_request_tokens(self) -> int:
        """The longest request, prompt and answer: what one slot / one sequence must hold."""
        return max(len(p) + n for p, n in zip(self.prompts, self.max_tokens, strict=True))


def _document(rng: random.Random, num_sentences: int) -> str:
    fields = dict(p=rng.choice(["laptop", "blender", "headset", "router", "heater"]), n=rng.randint(10000, 99999),
                  name=rng.choice(_NAMES), day=rng.choice(["Monday", "Tuesday", "Friday"]), k=rng.randint(2, 30),
                  city=rng.choice(_CITIES), price=rng.randint(20, 400))  # fmt: skip
    return " ".join(rng.choice(_DOC_PARTS).format(**fields) for _ in range(num_sentences))


def build_workloads(tokenizer: object, scale: float = 1.0, decode_concurrency: tuple[int, ...] = (1, 8, 32),
                    decode_tokens: int = 192) -> list[Workload]:  # fmt: skip
    """The workloads, sized by ``scale`` (1 = the full run; the 1B model and ``--quick`` use less)."""
    tok = tokenizer

    def encode(messages: list[dict[str, str]]) -> list[int]:
        return tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)  # type: ignore[attr-defined]

    n_label = max(4, int(64 * scale))
    chats, label_max = build_workload(n_label)
    labelled = [encode(c) for c in chats]
    workloads = [Workload("labelling", labelled, label_max, n_label)]
    n_light = max(4, n_label // 4)  # the same chats one at a time: a lightly loaded stream
    workloads.append(Workload("labelling-1", labelled[:n_light], label_max[:n_light], 1))
    new_tokens = max(8, int(decode_tokens * min(1.0, scale)))
    for c in decode_concurrency:
        num = max(c, 2) if c > 1 else max(2, int(3 * scale))  # one request at a time: a few in a row
        prompts = [encode([{"role": "user", "content": f"Tell a long story about {DECODE_TOPICS[i % 16]} (#{i})."}])
                   for i in range(num)]  # fmt: skip
        workloads.append(Workload(f"decode-{c}", prompts, [new_tokens] * num, c))
    rng = random.Random(3)
    n_docs = max(2, int(16 * scale))
    docs = [_document(rng, 18) for _ in range(n_docs)]
    prompts = [encode([{"role": "user", "content": f"Document:\n{d}\n\n{EXTRACTION_INSTRUCTION}"}]) for d in docs]
    workloads.append(Workload("extraction", prompts, [max(8, int(64 * min(1.0, scale)))] * n_docs, min(8, n_docs)))
    return workloads
