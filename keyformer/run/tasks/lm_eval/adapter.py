"""``lm_eval`` adapter: any prepared model under any cache policy, registered as model ``"keyformer"``.

Log-likelihood semantics (``semantics=``):

* ``prefill_then_decode`` (default, physical cache): the context is the prompt (full causal attention,
  then the cache is cut to ``k = budget_tokens(len(context))``); the continuation tokens are then fed one
  at a time, each attending to the ``k`` kept tokens plus itself and evicting one, exactly as in
  generation. The log-probability of continuation token ``t`` comes from the forward that fed token
  ``t - 1`` (token 0 from the prompt forward). Requests are left-padded into batches of ``batch_size``.
* ``per_row`` (the authors' / H2O harness): one forward over context + continuation with per-row masks,
  ``k`` computed from the whole length; see :mod:`keyformer.run.tasks.lm_eval.per_row`. One request per
  forward.

With the full policy both reduce to one plain causal forward (right-padded batches), as lm-eval's
``HFLM`` does. Keyformer's tau schedule spans the policy's ``max_new_tokens``, or 128 when it is null (not
the continuation length, so a row's score does not depend on its batch). ``generate_until`` uses
:func:`keyformer.core.generate.generate` (the generation path, physical cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from keyformer.core.generate import generate, make_cache
from keyformer.core.policies import Policy, make_policy

from .per_row import check_policy, per_row_scoring

SEMANTICS = ("prefill_then_decode", "per_row")
Request = tuple[tuple[str, str], list[int], list[int]]


def _load_named(name: str, device: str, dtype: str, seed: int) -> tuple[Any, Any]:
    """(model, tokenizer) for ``conf/model/<name>.yaml`` through ``keyformer.run.loading.load_model``."""
    from keyformer.run.loading import load_model, model_config

    return load_model({"model": model_config(name), "device": device, "dtype": dtype, "seed": seed})


def _expand_cache(cache: Any, idx: torch.Tensor) -> None:
    """Make row ``b`` of ``cache`` a copy of row ``idx[b]`` after the prompt forward (shared contexts); the
    naive-reference tests cover it."""
    cache.select_rows(idx)


@register_model("keyformer")
class KeyformerLM(TemplateLM):
    """lm-eval ``LM`` over a model prepared by :func:`keyformer.prepare_model` and a cache policy.

    Args:
        pretrained: a prepared model instance, or the name of a ``conf/model`` entry (e.g. ``smollm2``).
        tokenizer: required with a model instance.
        policy: a :class:`~keyformer.core.policies.Policy`, or a policy name built with ``policy_kwargs``.
        semantics: ``prefill_then_decode`` or ``per_row`` (see the module docstring).
        batch_size: requests per forward for ``prefill_then_decode``, full and ``generate_until``.
        seed: Keyformer's Gumbel-noise seed.
        max_length: context limit (defaults to the model's positional limit, else 2048).
        policy_kwargs: e.g. ``budget=0.5, recent=0.3`` when ``policy`` is a name (lm-eval ``model_args``).
    """

    def __init__(self, pretrained: Any = "smollm2", tokenizer: Any = None, policy: Policy | str = "full",
                 semantics: str = "prefill_then_decode", batch_size: int | str = 16, seed: int = 0,
                 max_length: int | None = None, max_gen_toks: int = 256, device: str = "cpu",
                 dtype: str = "float32", **policy_kwargs: Any):
        super().__init__()
        if semantics not in SEMANTICS:
            raise ValueError(f"semantics={semantics!r} is unknown; valid: {', '.join(SEMANTICS)}")
        self.policy = make_policy(policy, **policy_kwargs) if isinstance(policy, str) else policy
        if semantics == "per_row":
            check_policy(self.policy)  # before any model loads: per_row implements only some policies' rules
        if isinstance(pretrained, str):
            pretrained, tokenizer = _load_named(pretrained, device, dtype, int(seed))
        if tokenizer is None:
            raise ValueError("pass the tokenizer together with a model instance")
        self.model, self.tokenizer = pretrained.eval(), tokenizer
        self.semantics, self.seed = semantics, int(seed)
        self.batch_size = int(batch_size) if str(batch_size) != "auto" else 16
        self._max_length, self.max_gen_toks = max_length, int(max_gen_toks)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    # -- tokenisation (as HFLM for causal models) ---------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        if self._max_length:
            return int(self._max_length)
        from keyformer.run.loading import context_length

        return context_length(self.model) or 2048

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        kw = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        return self.tokenizer.encode(string, **kw)

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    # -- log-likelihood -----------------------------------------------------------------------------------
    def _truncate(self, ctx: list[int], cont: list[int]) -> tuple[list[int], list[int]]:
        """Left-truncate so context + continuation fit ``max_length`` (HFLM keeps the last max+1 tokens)."""
        cont = cont[-self.max_length:]
        keep = max(1, self.max_length + 1 - len(cont))
        return ctx[-keep:], cont

    def _loglikelihood_tokens(self, requests: list[Request], disable_tqdm: bool = False,
                              **kwargs: Any) -> list[tuple[float, bool]]:
        items = [self._truncate(list(c), list(t)) for _, c, t in requests]
        results: list[tuple[float, bool] | None] = [None] * len(items)
        if self.semantics == "per_row" and self.policy.evicts:
            order, bs = list(range(len(items))), 1
            run = self._per_row_batch
        elif not self.policy.evicts:
            order = sorted(range(len(items)), key=lambda i: -len(items[i][0]) - len(items[i][1]))
            bs, run = self.batch_size, self._full_batch
        else:  # rows sharing a context together (one prefill), longest continuations first
            longest: dict[tuple[int, ...], int] = {}
            for c, t in items:
                longest[tuple(c)] = max(longest.get(tuple(c), 0), len(t))
            order = sorted(range(len(items)), key=lambda i: (-longest[tuple(items[i][0])], items[i][0],
                                                             -len(items[i][1])))
            bs, run = self.batch_size, self._decode_batch
        bar = tqdm(total=len(items), disable=disable_tqdm, desc=f"loglikelihood ({self.policy.name})")
        with torch.inference_mode():
            for s in range(0, len(order), bs):
                idx = order[s:s + bs]
                for i, res in zip(idx, run([items[i] for i in idx]), strict=True):
                    results[i] = res
                    if requests[i][0] is not None:
                        self.cache_hook.add_partial("loglikelihood", requests[i][0], res)
                bar.update(len(idx))
        bar.close()
        return [r for r in results if r is not None]

    @staticmethod
    def _score(logprobs: torch.Tensor, cont: list[int]) -> tuple[float, bool]:
        """(sum of log p(cont), all greedy) from ``logprobs`` [T, V] aligned with ``cont``."""
        target = torch.tensor(cont, device=logprobs.device)
        ll = logprobs.gather(-1, target.view(-1, 1)).sum()
        return float(ll), bool((logprobs.argmax(-1) == target).all())

    def _full_batch(self, batch: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """No eviction: one causal forward over right-padded (context + continuation)[:-1]."""
        seqs = [(c + t)[:-1] for c, t in batch]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, :len(s)] = torch.tensor(s)
        lo = min(len(c) - 1 for c, _ in batch)  # logits only where some row has a continuation token
        keep = torch.arange(lo, width, device=self.device)
        logits = (self.model(input_ids=ids.to(self.device), use_cache=False,
                             logits_to_keep=keep).logits.float())
        out = []
        for b, (c, t) in enumerate(batch):
            n = len(c) + len(t) - 1 - lo
            out.append(self._score(F.log_softmax(logits[b, n - len(t):n], dim=-1), t))
        return out

    def _decode_batch(self, batch: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """prefill_then_decode: prompt = context (left-padded; each distinct context prefilled once and its
        cache copied to the rows that share it), then one continuation token per forward."""
        B, dev = len(batch), self.device
        uniq: dict[tuple[int, ...], int] = {}
        row_ctx = torch.tensor([uniq.setdefault(tuple(c), len(uniq)) for c, _ in batch], device=dev)
        N = max(len(c) for c in uniq)
        T = max(len(t) for _, t in batch)
        ids = torch.full((len(uniq), N), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(uniq), N), dtype=torch.long)
        for u, c in enumerate(uniq):
            ids[u, N - len(c):], mask[u, N - len(c):] = torch.tensor(c), 1
        cont = torch.full((B, T), self.pad_id, dtype=torch.long)
        for b, (_, t) in enumerate(batch):
            cont[b, :len(t)] = torch.tensor(t)
        ids, mask, cont = ids.to(dev), mask.to(dev), cont.to(dev)
        cache = make_cache(self.model, self.policy, mask, seed=self.seed)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache,
                            logits_to_keep=1).logits[:, -1]
        if len(uniq) < B:
            _expand_cache(cache, row_ctx)
            logits, mask = logits[row_ctx], mask[row_ctx]
        n = mask.sum(-1)
        steps = [F.log_softmax(logits.float(), dim=-1)]
        for t in range(1, T):
            mask = torch.cat([mask, mask.new_ones(B, 1)], dim=1)
            logits = self.model(input_ids=cont[:, t - 1:t], attention_mask=mask,
                                position_ids=(n + t - 1).view(B, 1), cache=cache).logits
            steps.append(F.log_softmax(logits[:, -1].float(), dim=-1))
        lp = torch.stack(steps, dim=1)  # [B, T, V]
        return [self._score(lp[b, :len(t)], t) for b, (_, t) in enumerate(batch)]

    def _per_row_batch(self, batch: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """per_row: one forward over the whole text (last continuation token included: it counts in L)."""
        (c, t), = batch
        ids = torch.tensor([c + t], device=self.device)
        with per_row_scoring(self.model, self.policy, self.seed):
            logits = self.model(input_ids=ids, use_cache=False).logits[0].float()
        n = len(c)
        return [self._score(F.log_softmax(logits[n - 1:n - 1 + len(t)], dim=-1), t)]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Perplexity windows as in HFLM (disjoint windows of ``max_length``), scored with this semantics."""
        out = []
        for req in tqdm(requests, disable=disable_tqdm, desc="loglikelihood_rolling"):
            (string,) = req.args
            windows = map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1))
            requests = [(None, c, t) for c, t in windows]
            res = self._loglikelihood_tokens(requests, disable_tqdm=True)  # type: ignore[misc]
            total = sum(r[0] for r in res)
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
            out.append(total)
        return out

    # -- generation ---------------------------------------------------------------------------------------
    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy generation under the policy (physical cache); stops at ``until`` strings or EOS."""
        out = []
        for req in tqdm(requests, disable=disable_tqdm, desc=f"generate_until ({self.policy.name})"):
            context, gen_kwargs = req.args
            kw = dict(gen_kwargs or {})
            until = kw.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            eot = self.tok_decode([self.eot_token_id])
            if eot not in until:
                until.append(eot)
            max_new = int(kw.get("max_gen_toks", self.max_gen_toks))
            ctx = self.tok_encode(context)[-(self.max_length - max_new):]
            ids = torch.tensor([ctx], device=self.device)
            with torch.inference_mode():
                res = generate(self.model, ids, torch.ones_like(ids), self.policy, max_new_tokens=max_new,
                               seed=self.seed, eos_token_id=self.eot_token_id, pad_token_id=self.pad_id)
            text = self.tok_decode(res.sequences[0].tolist())
            for stop in until:
                if stop and stop in text:
                    text = text[:text.index(stop)]
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
            out.append(text)
        return out
