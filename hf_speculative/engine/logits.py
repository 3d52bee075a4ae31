"""The target's logits as the engine reads them: `vocab_logits` (a few rows through a large vocabulary projection),
`NodeLogits` (per tree node, computed lazily for the nodes the acceptance walk visits) and `FinalState` (the final
hidden state they are computed from, without every layer's)."""

from __future__ import annotations

import contextlib
import time

import torch

from .hooks import this_thread_only
from .trees import DraftTree

__all__ = ["PREFETCH_ROWS", "FinalState", "NodeLogits", "vocab_logits"]


def vocab_logits(states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(states, weight)`` for drafting: a few rows through a large, bias-free vocabulary projection.

    Drafters project a handful of rows per step (K Medusa heads, k+1 ParallelSpec positions, gamma
    streams). CPU BLAS runs ``linear`` with 2-16 rows against a 49k x 576 weight about 2x slower than
    ``(W @ x^T)^T`` (the measurement: docs/results/2026-11-26-step-cost.md), so without autograd the transposed
    product is used; otherwise (training, one row, many rows) ``linear``.
    """
    x = states.to(weight.dtype)
    rows = x.reshape(-1, x.shape[-1])
    if 1 < rows.shape[0] <= 16 and not torch.is_grad_enabled():
        return (weight @ rows.T).T.reshape(*x.shape[:-1], weight.shape[0])
    return torch.nn.functional.linear(x, weight)


#: rows the LM head computes together when a node's logits are first needed: on CPU BLAS a single-row product with
#: SmolLM2's 49K x 576 head is a slow matrix-vector product while 2-4 rows cost less in all, so the likely next rows
#: come almost for free (measured: docs/results/2026-11-26-step-cost.md)
PREFETCH_ROWS = 4


#: vocabulary rows the lazy head's check recomputes (`NodeLogits.lazy_head`): the prefill's largest logits, where logit
#: scaling or soft-capping shows most, and every CHECK_STRIDE-th row
CHECK_TOP, CHECK_STRIDE = 32, 64


class NodeLogits:
    """The target's logits per tree node, computed only for the nodes the acceptance walk visits.

    A tree step needs logits at the accepted path and one node past it (a few of the n nodes); the LM
    head over a large vocabulary for every node is a large share of a tree forward's compute. When the
    model's logits are plain ``lm_head(final hidden state)`` (checked once on the prefill: models with
    logit scaling or soft-capping fail the check), the forward keeps a single logit row and the head is
    applied lazily: a visited node's row is computed together with its rank-0 descendants (the path the walk
    most likely takes next, up to `PREFETCH_ROWS` rows) in one product. Otherwise all logits come from the
    forward.
    """

    def __init__(
        self,
        outputs,
        head: torch.nn.Module | None,
        draft: DraftTree | None = None,
        row: int = 0,
        project=None,
        final: torch.Tensor | None = None,
    ):
        self.head = head
        self.project = project  # the engine's kernel for a few head rows (`kernels.head_projector`), or None
        self.seconds = 0.0  # time spent in the LM head here: the target's work, not the engine's
        if head is None:
            self.full = outputs.logits[row]
            return
        # the final hidden state: `FinalState`'s capture, else the forward's ``hidden_states[-1]``
        self.hidden = (final if final is not None else outputs.hidden_states[-1])[row]
        self.rows: dict[int, torch.Tensor] = {}
        children = draft.children if draft is not None else ((),) * self.hidden.shape[0]
        self.first_child = [kids[0] if kids else -1 for kids in children]

    def _compute(self, node: int) -> None:
        nodes = [node]
        while len(nodes) < PREFETCH_ROWS and self.first_child[nodes[-1]] >= 0:
            nodes.append(self.first_child[nodes[-1]])
        nodes = [i for i in nodes if i not in self.rows]
        start = time.perf_counter()
        # without the engine's kernels never a single-row product (slow on some CPU BLAS); with them, what the
        # measured kernel table chose for that many rows
        rows = nodes if len(nodes) > 1 or self.project is not None else nodes * 2
        logits = self._project(self.hidden[rows])
        for i, node_i in enumerate(nodes):
            self.rows[node_i] = logits[i].float()
        self.seconds += time.perf_counter() - start

    def _project(self, states: torch.Tensor) -> torch.Tensor:
        fast = self.project(states) if self.project is not None else None
        if fast is not None:
            return fast
        weight = getattr(self.head, "weight", None)
        if isinstance(self.head, torch.nn.Linear) and weight is not None:
            logits = vocab_logits(states, weight)
            return logits + self.head.bias if self.head.bias is not None else logits
        return self.head(states)

    @staticmethod
    def prefetch(items: list["NodeLogits"], depth: int = 2) -> None:
        """With a batch, the first ``depth`` nodes of every row's likeliest path (root, first child, ...) in ONE
        head product: the rows every acceptance walk reads first, without a small product per row."""
        if len(items) < 2 or items[0].head is None:
            return
        picks = []
        for a, item in enumerate(items):
            node = 0
            for _ in range(depth):
                picks.append((a, node))
                node = item.first_child[node]
                if node < 0:
                    break
        start = time.perf_counter()
        states = torch.stack([items[a].hidden[node] for a, node in picks])
        logits = items[0]._project(states)
        for (a, node), row in zip(picks, logits):
            items[a].rows[node] = row.float()
        items[0].seconds += time.perf_counter() - start

    def __getitem__(self, node: int) -> torch.Tensor:
        if self.head is None:
            return self.full[node].float()
        if node not in self.rows:
            self._compute(node)
        return self.rows[node]

    @staticmethod
    def lazy_head(model, prefill_outputs) -> torch.nn.Module | None:
        """The LM head when ``logits == lm_head(hidden_states[-1])`` holds for this model, else None."""
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        hidden = getattr(prefill_outputs, "hidden_states", None)
        if head is None or not hidden:
            return None
        reference, states = prefill_outputs.logits[:, -1].float(), hidden[-1][:, -1]
        if type(head) is torch.nn.Linear:  # a few vocabulary rows, not the whole head (one more head product a call)
            vocab = reference.shape[-1]
            top = reference.topk(min(CHECK_TOP, vocab), dim=-1).indices.flatten()
            rows = torch.cat([top, torch.arange(0, vocab, CHECK_STRIDE, device=top.device)]).unique()
            bias = None if head.bias is None else head.bias[rows]
            recomputed = torch.nn.functional.linear(states.to(head.weight.dtype), head.weight[rows], bias).float()
            reference = reference[:, rows]
        else:
            recomputed = head(states).float()
        return head if torch.allclose(recomputed, reference, rtol=1e-4, atol=1e-4) else None


class FinalState:
    """The decoder's final (normed) hidden state of a forward, from one hook on the model's decoder
    (``model.get_decoder()``), for the lazy head: ``output_hidden_states`` would record every layer's output
    (transformers' output-capturing hooks, about 1% of a one-token step of SmolLM2-135M on two cores), which a drafter
    that reads none of them does not need. `check` compares the capture with a forward's ``hidden_states[-1]`` once per
    call (the prefill): a model whose decoder output is not the state its head reads keeps ``output_hidden_states``."""

    def __init__(self, model):
        get = getattr(model, "get_decoder", None)
        try:
            decoder = get() if callable(get) else None
        except (AttributeError, NotImplementedError, ValueError):  # a model with no decoder to name
            decoder = None
        self.decoder = decoder if isinstance(decoder, torch.nn.Module) and decoder is not model else None
        self.state: torch.Tensor | None = None

    @contextlib.contextmanager
    def capture(self):
        """Within: each forward of the decoder in this thread leaves its final hidden state in ``state`` (another
        thread's ``generate()`` on the same model runs the same module and its hooks: its forwards are not this
        call's)."""
        self.state = None
        if self.decoder is None:
            yield self
            return

        def keep(module, args, output):
            state = getattr(output, "last_hidden_state", None)
            if state is None and isinstance(output, (tuple, list)) and output:
                state = output[0]
            self.state = state if isinstance(state, torch.Tensor) else None

        handle = self.decoder.register_forward_hook(this_thread_only(keep))
        try:
            yield self
        finally:
            handle.remove()

    def check(self, outputs) -> bool:
        """Whether the state captured in the forward that returned ``outputs`` is its ``hidden_states[-1]``."""
        hidden = getattr(outputs, "hidden_states", None)
        last = hidden[-1] if hidden else None
        captured = self.state
        return (
            last is not None and captured is not None and captured.shape == last.shape and torch.equal(captured, last)
        )
