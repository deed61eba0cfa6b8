"""Exact law of one round of tree verification, by recursion over the tree (the audit's oracle).

The rule of :func:`fastspec.decoding.tree.verify_tree_rejection` is re-derived here in closed form:
at a node the children are tested in order, child ``x`` accepted with probability
``min(1, p_res(x) / q(x))``, the residual updated after each rejection; the mass left after
the last child goes to the residual's tokens. Completing each round's output with the target's
own law to a fixed length gives a law over sequences that must equal the target's joint law
(total variation 0 up to rounding). The negative control (``normalise=False``: the
un-normalised residual is reused for the next sibling's test) must not.

Sampled siblings come in two kinds: drawn independently (sibling ``k`` from its own
``q_of(prefix, k)``) or without replacement (sibling ``k`` from ``q_of(prefix, 0)`` with
siblings ``1 .. k-1`` removed and renormalised, the row the drafter then reports). The second
has its own negative control: reporting the un-removed ``q`` for every sibling (the
independent rule applied to without-replacement draws) must be caught.

Target and draft are functions of the prefix, so every law is exact (no sampling).
"""
from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Callable

import numpy as np

from fastspec.audit.registry import PREFIX, AuditContext, register_check

__all__ = ["tree_round_law", "extended_law", "target_joint_law", "tree_law_tv",
           "check_tree_exact_law", "check_tree_exact_law_without_replacement", "SIBLINGS"]

#: How sampled siblings are drawn (``tree_round_law``'s ``siblings``).
SIBLINGS = ("independent", "without_replacement")

Dist = Callable[[tuple], np.ndarray]


def _children(parents):
    kids = [[] for _ in range(len(parents) + 1)]
    for i, par in enumerate(parents):
        kids[par + 1].append(i)
    return kids


def _round_law_fixed(p_of: Dist, prefix: tuple, tokens, kids, q_rows, normalise, out, mass):
    """Add the law of one round with fixed tree tokens (q_rows[i]: node i's q or None)."""
    def at(row, pre, w):
        residual = np.asarray(p_of(pre), dtype=np.float64)
        original = residual
        left = w
        for c in kids[row]:
            x = tokens[c]
            qx = 1.0 if q_rows[c] is None else q_rows[c][x]
            a = min(1.0, residual[x] / qx)
            if a > 0:
                at(c + 1, pre + (x,), left * a)
            left *= 1.0 - a
            if q_rows[c] is None:
                residual = residual.copy()
                residual[x] = 0.0
            else:
                residual = np.maximum(residual - q_rows[c], 0.0)
            total = residual.sum()
            if not total > 0:
                residual = original
            elif normalise:
                residual = residual / total
        if left > 0:
            final = residual / residual.sum()
            for y in np.flatnonzero(final > 0):
                out[pre[len(prefix):] + (int(y),)] += left * final[y]
    at(0, prefix, mass)


def tree_round_law(p_of: Dist, prefix: tuple, tokens, parents, q_of: Callable | None = None,
                   normalise: bool = True, siblings: str = "independent",
                   report_base_q: bool = False) -> dict[tuple, float]:
    """Law of the tokens a round emits (accepted path + next token).

    Parameters
    ----------
    p_of : callable, prefix tuple -> ndarray (V,)
        The target's next-token law.
    prefix : tuple of int
        The committed sequence (its last token is the root).
    tokens : sequence of int
        Node tokens for deterministic proposals (ignored for nodes drafted from ``q_of``).
    parents : sequence of int
    q_of : callable (prefix tuple, sibling index) -> ndarray (V,), optional
        When given, every node is drawn from ``q_of(parent prefix, k)`` (``k``: its rank
        among its siblings) and the law averages over those draws.
    normalise : bool
        False: the negative control.
    siblings : {"independent", "without_replacement"}
        With ``q_of``: ``"without_replacement"`` draws sibling ``k`` from
        ``q_of(parent prefix, 0)`` with the earlier siblings' tokens removed, renormalised.
    report_base_q : bool
        Without replacement only: the verifier is told ``q_of(parent prefix, 0)`` instead of
        the law the sibling was drawn from (that negative control).
    """
    if siblings not in SIBLINGS:
        raise ValueError(f"siblings must be one of {SIBLINGS}, got {siblings!r}")
    if report_base_q and (q_of is None or siblings != "without_replacement"):
        raise ValueError("report_base_q needs q_of and siblings='without_replacement'")
    parents = list(parents)
    kids = _children(parents)
    out: dict[tuple, float] = defaultdict(float)
    if q_of is None:
        _round_law_fixed(p_of, prefix, list(tokens), kids, [None] * len(parents), normalise, out,
                         1.0)
        return dict(out)
    rank = {c: k for row in kids for k, c in enumerate(row)}
    vocab = len(p_of(prefix))
    for drawn in itertools.product(range(vocab), repeat=len(parents)):
        weight, q_rows = 1.0, []
        for i, par in enumerate(parents):
            pre = prefix + tuple(drawn[j] for j in _path(parents, par))
            if siblings == "independent":
                q = np.asarray(q_of(pre, rank[i]), dtype=np.float64)
                told = q
            else:
                told = np.asarray(q_of(pre, 0), dtype=np.float64)
                q = told.copy()
                q[[drawn[c] for c in kids[par + 1][:rank[i]]]] = 0.0
                q = q / q.sum() if q.sum() > 0 else q
                told = told if report_base_q else q
            weight *= q[drawn[i]]
            if weight == 0:
                break
            q_rows.append(told)
        if weight > 0:
            _round_law_fixed(p_of, prefix, list(drawn), kids, q_rows, normalise, out, weight)
    return dict(out)


def _path(parents, node):
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def extended_law(p_of: Dist, prefix: tuple, law: dict[tuple, float], length: int):
    """Complete every outcome of ``law`` to ``length`` tokens with the target's own law."""
    out: dict[tuple, float] = defaultdict(float)
    for seq, w in law.items():
        for tail, v in target_joint_law(p_of, prefix + seq, length - len(seq)).items():
            out[seq + tail] += w * v
    return dict(out)


def target_joint_law(p_of: Dist, prefix: tuple, length: int) -> dict[tuple, float]:
    """The target's law of the next ``length`` tokens after ``prefix``."""
    if length <= 0:
        return {(): 1.0}
    out = {}
    p = np.asarray(p_of(prefix), dtype=np.float64)
    for y in np.flatnonzero(p > 0):
        for tail, v in target_joint_law(p_of, prefix + (int(y),), length - 1).items():
            out[(int(y),) + tail] = p[y] * v
    return out


def tree_law_tv(p_of: Dist, prefix: tuple, tokens, parents, q_of=None,
                normalise: bool = True, siblings: str = "independent",
                report_base_q: bool = False) -> float:
    """Total variation between a round completed by the target and the target's own law
    (arguments as :func:`tree_round_law`)."""
    depth = 0
    for node in range(len(parents)):
        depth = max(depth, len(_path(list(parents), node)))
    length = depth + 1
    law = extended_law(p_of, prefix, tree_round_law(p_of, prefix, tokens, parents, q_of,
                                                    normalise, siblings, report_base_q), length)
    ref = target_joint_law(p_of, prefix, length)
    keys = set(law) | set(ref)
    return 0.5 * sum(abs(law.get(k, 0.0) - ref.get(k, 0.0)) for k in keys)


#: The audit's trees (tokens, parents): three siblings with children, a duplicate sibling.
AUDIT_TREES = (([3, 4, 6, 4, 4, 4], [-1, -1, -1, 0, 1, 2]),
               ([0, 1, 1, 2, 5], [-1, -1, -1, 0, 3]))


def _toy_laws(ctx: AuditContext):
    """The toy target's law and a draft's ``q_of(prefix, k)`` (sibling k at temperature
    1 + k/2), temperature 1."""
    from fastspec import kernels
    from fastspec.audit.oracle import ExactOracle
    from fastspec.decoding.sampling import SamplingParams
    sampling = SamplingParams(1.0, 0, 1.0)
    target = ExactOracle(ctx.model(69, 2), sampling)
    draft = ExactOracle(ctx.model(69, 1), sampling)

    def q_of(prefix, k):
        z = np.log(np.maximum(draft.p_next(prefix), 1e-300))
        return kernels.module("numpy").probs(z, 1.0 + 0.5 * k)

    return target.p_next, q_of


@register_check("tree_exact_law", group="tree")
def check_tree_exact_law(ctx: AuditContext) -> dict:
    """Tree verification's exact law equals the target's (toy target, temperature 1, deterministic
    and sampled siblings); the un-normalised residual is caught."""
    p_of, q_of = _toy_laws(ctx)
    prefix = tuple(PREFIX[:6])
    exact = [tree_law_tv(p_of, prefix, t, p) for t, p in AUDIT_TREES]
    exact.append(tree_law_tv(p_of, prefix, None, [-1, -1, 0], q_of))
    broken = [tree_law_tv(p_of, prefix, t, p, normalise=False) for t, p in AUDIT_TREES]
    broken.append(tree_law_tv(p_of, prefix, None, [-1, -1, 0], q_of, normalise=False))
    return dict(passed=bool(max(exact) < 1e-12 and min(broken) > 1e-3),
                tv=[float(x) for x in exact], negative_control_tv=[float(x) for x in broken],
                tolerance=1e-12)


#: Shapes of the without-replacement audit: three siblings; two siblings, the first with two
#: children of its own.
WOR_TREES = ([-1, -1, -1], [-1, -1, 0, 0])


@register_check("tree_exact_law_without_replacement", group="tree")
def check_tree_exact_law_without_replacement(ctx: AuditContext) -> dict:
    """Siblings drawn without replacement, each verified with the law it was drawn from (``q``
    minus the earlier siblings, renormalised), keep the target's law exactly; reporting the
    un-removed ``q`` (the independent-siblings rule) and the un-normalised residual are caught."""
    p_of, q_of = _toy_laws(ctx)
    prefix = tuple(PREFIX[:6])
    wor = dict(q_of=q_of, siblings="without_replacement")
    exact = [tree_law_tv(p_of, prefix, None, par, **wor) for par in WOR_TREES]
    base_q = [tree_law_tv(p_of, prefix, None, par, report_base_q=True, **wor)
              for par in WOR_TREES]
    unnormalised = [tree_law_tv(p_of, prefix, None, par, normalise=False, **wor)
                    for par in WOR_TREES]
    broken = base_q + unnormalised
    return dict(passed=bool(max(exact) < 1e-12 and min(broken) > 1e-3),
                tv=[float(x) for x in exact],
                negative_control_tv=[float(x) for x in broken],
                negative_controls=["un-removed q"] * len(base_q)
                + ["un-normalised residual"] * len(unnormalised),
                tolerance=1e-12)
