"""Sums of products of two reads as BLAS matrix products, for the NumPy reference.

`contract_pair` turns `out[...] += a[...] * b[...]` over strided views into one (batched)
matrix product. `shifted_window_sum` handles the stride-1 windowed case (a convolution with
any padding and dilation) without the im2col copy: for each window offset, the input read is
a plain matrix with a row stride, so BLAS reads the padded input in place.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from tilekit.expr.analysis import AccessInfo, Analysis
from tilekit.expr.ast import Num


def contract_pair(a: np.ndarray, a_axes: str, b: np.ndarray, b_axes: str,
                  out_axes: list[str]) -> np.ndarray:
    """sum over shared non-output axes of a * b, as one (batched) matrix product.

    Axes are single letters. Operands are arranged as (batch, m, k) and (batch, k, n); the
    transpose+reshape of a strided view is the im2col copy that lets BLAS do the work. With
    batch axes and a short contraction (depthwise convolution), a multiply-add per
    contraction index beats a batch of tiny matrix products.
    """
    def presum(x, xa, other):
        drop = tuple(i for i, ax in enumerate(xa) if ax not in out_axes and ax not in other)
        if drop:
            x = x.sum(axis=drop)
            xa = "".join(ax for i, ax in enumerate(xa) if i not in drop)
        return x, xa

    a, a_axes = presum(a, a_axes, b_axes)
    b, b_axes = presum(b, b_axes, a_axes)
    # The product comes out as (batch, a-only, b-only): take the operand whose own axes come
    # first in the output as `a`, so that the result needs no transposing copy (y[n,f,h,w]
    # from x[n,c,h,w] and w[f,c] is w @ x, not (x^T @ w^T)^T).
    # Axes of extent 1 (a batch of one) do not decide the layout.
    sizes = {**dict(zip(a_axes, a.shape)), **dict(zip(b_axes, b.shape))}
    first = {ax: i for i, ax in enumerate(out_axes) if sizes.get(ax, 1) > 1}
    a_first = min((first[ax] for ax in a_axes if ax in first and ax not in b_axes), default=-1)
    b_first = min((first[ax] for ax in b_axes if ax in first and ax not in a_axes), default=-1)
    if 0 <= b_first < a_first:
        a, a_axes, b, b_axes = b, b_axes, a, a_axes
    batch = [ax for ax in out_axes if ax in a_axes and ax in b_axes]
    contract = [ax for ax in a_axes if ax in b_axes and ax not in out_axes]
    m_axes = [ax for ax in a_axes if ax not in b_axes]
    n_axes = [ax for ax in b_axes if ax not in a_axes]
    size = {**dict(zip(a_axes, a.shape)), **dict(zip(b_axes, b.shape))}
    nb = math.prod(size[x] for x in batch)
    nm = math.prod(size[x] for x in m_axes)
    nk = math.prod(size[x] for x in contract)
    nn = math.prod(size[x] for x in n_axes)
    lhs = as_matrices(a, a_axes, batch, m_axes, contract, (nb, nm, nk))
    rhs = as_matrices(b, b_axes, batch, contract, n_axes, (nb, nk, nn))
    if nb > 1 and nk <= 16:
        prod = lhs[:, :, 0, None] * rhs[:, None, 0, :]
        for k in range(1, nk):
            prod += lhs[:, :, k, None] * rhs[:, None, k, :]
    else:
        prod = np.matmul(lhs, rhs)
    order = batch + m_axes + n_axes
    prod = prod.reshape(tuple(size[x] for x in order))
    return prod.transpose([order.index(x) for x in out_axes])


def as_matrices(x: np.ndarray, axes: str, batch: list[str], rows: list[str],
                cols: list[str], shape: tuple[int, int, int]) -> np.ndarray:
    """`x` as a stack of (rows x cols) matrices, without a copy when its memory allows.

    A weight stored (n, k) serves as a transposed (k, n) view that BLAS reads directly. When
    a copy is unavoidable (im2col of a strided view), copy in the order whose innermost run
    is longest, and transpose the result as a view.
    """
    options = [(batch + rows + cols, False), (batch + cols + rows, True)]
    best = None
    for order, swapped in options:
        t = x.transpose([axes.index(a) for a in order])
        nshape = (shape[0], shape[2], shape[1]) if swapped else shape
        try:
            view = t.view()
            view.shape = nshape  # raises when this needs a copy
        except AttributeError:
            stride = abs(t.strides[-1]) if t.ndim else 0
            run = t.shape[-1] if t.ndim else 1
            key = (stride == 0, stride, -run)
            if best is None or key < best[0]:
                best = (key, t, nshape, swapped)
            continue
        return view.swapaxes(1, 2) if swapped else view
    _, t, nshape, swapped = best
    flat = t.reshape(nshape)
    return flat.swapaxes(1, 2) if swapped else flat


# -- stride-1 windows --------------------------------------------------------------------

def _window_dims(analysis: Analysis, image: AccessInfo, filt: AccessInfo):
    """[(dim, spatial axis, window axis, dilation)] for the image's trailing windowed dims,
    or None when the pair is not a stride-1 window sum this path handles."""
    spatial = [a for a, _ in analysis.spatial]
    reduction = {a for a, _ in analysis.reduction}
    if not (image.affine and filt.affine):
        return None
    windows = []
    for dim, m in enumerate(image.maps):
        terms = dict(m.terms)
        if len(terms) == 2:
            s = [a for a in terms if a in spatial]
            r = [a for a in terms if a in reduction]
            if len(s) != 1 or len(r) != 1 or terms[s[0]] != 1 or terms[r[0]] <= 0:
                return None
            windows.append((dim, s[0], r[0], terms[r[0]]))
        elif len(terms) > 2 or (len(terms) == 1 and (next(iter(terms.values())) != 1
                                                      or m.const != 0)):
            return None
    if not windows:
        return None
    k = len(windows)
    ndim = len(image.maps)
    # Windowed dims are the image's last k dims and the output's last k axes, in order.
    if [w[0] for w in windows] != list(range(ndim - k, ndim)):
        return None
    if [w[1] for w in windows] != spatial[-k:]:
        return None
    window_axes = {w[2] for w in windows}
    other = [a for m in image.maps[:ndim - k] for a, _ in m.terms]
    if window_axes & set(other) or len(set(other)) != len(other):
        return None
    if any(len(m.terms) != 1 for m in image.maps[:ndim - k]):
        return None  # a constant index (x[n, 0, ..]): one leading dim without an axis
    for m in filt.maps:
        if not (isinstance(m.node, Num) or (len(m.terms) == 1 and m.terms[0][1] == 1
                                            and m.const == 0)):
            return None
        if m.terms and m.terms[0][0] in {w[1] for w in windows}:
            return None
    if not window_axes <= {a for m in filt.maps for a, _ in m.terms}:
        return None
    return windows


def shifted_window_sum(analysis: Analysis, image: AccessInfo, filt: AccessInfo,
                       env, padded: Callable[[AccessInfo, list], tuple[np.ndarray, list]],
                       ) -> np.ndarray | None:
    """`out += image[.., s + d*r + c, ..] * filt[.., r, ..]` over the whole iteration space,
    as one matrix product per window offset, or None when the statement has another form.

    The image is padded so that every read is in bounds, plus one spare row; the windowed
    output dims are computed over the padded width (rows of the padded image are contiguous)
    and the columns past the true width are dropped at the end.
    """
    windows = _window_dims(analysis, image, filt)
    if windows is None:
        return None
    extents = analysis.extents
    # Worth it when the im2col copy it saves (one input column per output point) outweighs
    # a filter re-layout: many output points, few filters (early layers, not late ones).
    filters = math.prod(extents[a] for m in filt.maps for a, _ in m.terms
                        if a in dict(analysis.spatial))
    if filters > math.prod(extents[w[1]] for w in windows):
        return None
    ndim = len(image.maps)
    k = len(windows)
    arr, widths = padded(image, [(0, 1)] + [(0, 0)] * (k - 1))
    item = arr.itemsize
    lead = [a for m in image.maps[:ndim - k] for a, _ in m.terms]  # e.g. n, c
    padded_shape = arr.shape[ndim - k:]
    run = extents[windows[0][1]] * math.prod(padded_shape[1:])
    window_strides = [s // item for s in arr.strides[ndim - k:]]
    flat = arr.reshape(-1)
    spatial = [a for a, _ in analysis.spatial]
    letters = {a: chr(ord("a") + i) for i, a in enumerate(spatial + [a for a, _ in analysis.reduction])}
    run_letter = "Z"
    out_axes = [a for a in spatial[:-k]]
    # The filter with its window dims first, so that each window offset is one contiguous
    # matrix (one copy of the filter instead of one strided slice per offset).
    window_of_dim = {dim: w[2] for dim, m in enumerate(filt.maps) for w in windows
                     if m.terms and m.terms[0][0] == w[2]}
    filt_order = sorted(window_of_dim, key=lambda d: [w[2] for w in windows].index(
        window_of_dim[d]))
    filt_arr = np.ascontiguousarray(np.moveaxis(np.asarray(env[filt.tensor]), filt_order,
                                                range(len(filt_order))))
    rest_maps = [m for d, m in enumerate(filt.maps) if d not in window_of_dim]
    acc = None
    for point in itertools.product(*(range(extents[w[2]]) for w in windows)):
        offset = sum((m.const + before) * stride
                     for m, (before, _), stride in zip(image.maps[ndim - k:], widths[ndim - k:],
                                                       window_strides))
        offset += sum(d * r * stride for (_, _, _, d), r, stride in zip(windows, point,
                                                                        window_strides))
        lead_strides = [s // item for s in arr.strides[:ndim - k]]
        lead_shape = list(arr.shape[:ndim - k])
        view = as_strided(flat[offset:], shape=lead_shape + [run],
                          strides=[s * item for s in lead_strides] + [item], writeable=False)
        index = tuple(point) + tuple(int(m.node.value) if isinstance(m.node, Num) else
                                     slice(None) for m in rest_maps)
        f_axes = [m.terms[0][0] for m in rest_maps if not isinstance(m.node, Num)]
        part = contract_pair(view, "".join(letters[a] for a in lead) + run_letter,
                             filt_arr[index], "".join(letters[a] for a in f_axes),
                             [letters[a] for a in out_axes if a in lead + f_axes] + [run_letter])
        if acc is None:  # the first product is fresh unless it is a view of an operand
            shared = np.may_share_memory(part, arr) or np.may_share_memory(part, filt_arr)
            acc = part.copy() if shared or not part.flags.writeable else part
        else:
            np.add(acc, part, out=acc)
    # Back to the output's axes: drop the padded columns of the windowed dims.
    kept = [a for a in out_axes if a in lead + f_axes]
    shape = [acc.shape[i] for i in range(len(kept))] + [extents[windows[0][1]]] + \
        list(padded_shape[1:])
    acc = acc.reshape(shape)
    acc = acc[(slice(None),) * (len(kept) + 1) +
              tuple(slice(0, extents[w[1]]) for w in windows[1:])]
    full = [extents[a] if a in kept else 1 for a in out_axes] + [extents[w[1]] for w in windows]
    return acc.reshape(full)
