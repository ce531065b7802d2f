"""The breakdown of one trace at a time in compiled code (numba), over the store's columns.

Each function mirrors one of ``_breakdown`` and ``_server_time`` step for step (the same
arithmetic in the same order, so the seconds agree to the last bit with the Python path's), on
integer codes instead of strings: a span's name, stage and model are codes into one
dictionary of the chunk's strings, a component is a code (``FIXED`` names, then families of
``server <string>`` and others, see ``_columns.component_name``). A trace whose shape the kernel
leaves to the Python path (an orphan, a parent cycle, a span its own parent, an id that is not
hex, a proxy's or Ray Serve's spans) is flagged, and nothing of it is kept here.

numba is imported here alone, and this module only on first use (``import otelkit`` stays cheap).
"""

from __future__ import annotations

import numpy as np
from numba import njit

# components with fixed names: their codes are their places here (``_columns`` names them)
SERIALIZE, DESERIALIZE, CONNECTION, NETWORK, QUEUE, SERVER_OTHER = 0, 1, 2, 3, 4, 5
CLIENT_OTHER, TOTAL, RECEIVE, FRONTEND, SEND, HANDLER = 6, 7, 8, 9, 10, 11
ENSEMBLE, SCHEDULER, COMPUTE_INPUT, COMPUTE_OUTPUT, CALLS_OUT, NO_SERVER = 12, 13, 14, 15, 16, 17
FIXED = 18
# the families of components named after a string of the chunk (its code added to the base)
SERVER_NAMED, HAND_OFF, COMPUTE, CLIENT_STAGE, AS_SPAN = 1, 2, 3, 4, 5

# the events read, by code (``_columns.EVENTS`` lists their names in this order)
Q_START, C_START, C_IN, C_OUT, C_END = 0, 1, 2, 3, 4
HR0, HR1, GR0, GR1, HS0, HS1, GS0, GS1, M_RECV, M_START, M_SENT = range(5, 16)
EVENTS = 16
NONE = np.iinfo(np.int64).min  # an event a span does not have
_NS = 1e-9
_SMALL = 48  # arrays this short are sorted by insertion
_MAX_COMPONENTS = 512  # a root's distinct components; past it the trace goes to Python
_PROBLEM_START, _PROBLEM_EXCEED = 1, 2


@njit(cache=True)
def _pair(times, span, first):  # type: ignore[no-untyped-def]
    """``_server_time._pair`` over the HTTP and gRPC event pairs starting at ``first``."""
    for offset in (0, 2):
        start = times[span, first + offset]
        end = times[span, first + offset + 1]
        if start != NONE and end != NONE and end >= start:
            return True, start, end
    return False, 0, 0


@njit(cache=True)
def _add(comps, vals, parts, count, comp, value, part):  # type: ignore[no-untyped-def]
    """``_breakdown._add`` into a root's components in order of first addition; the count
    after it, -1 past the room there is."""
    for index in range(count):
        if comps[index] == comp:
            vals[index] += value
            parts[index] |= part
            return count
    if count >= comps.shape[0]:
        return -1
    comps[count] = comp
    vals[count] = 0.0 + value  # a dict's get(name, 0.0) + seconds
    parts[count] = part
    return count + 1


@njit(cache=True)
def _has_stages(span, kids, koff, stage, client, tmodel):  # type: ignore[no-untyped-def]
    stack = [kids[i] for i in range(koff[span], koff[span + 1])]
    while stack:
        child = stack.pop()
        if stage[child] >= 0:
            return True
        if not client[child] and tmodel[child] < 0:
            for i in range(koff[child], koff[child + 1]):
                stack.append(kids[i])
    return False


@njit(cache=True)
def _labelled(  # type: ignore[no-untyped-def]
    server, kids, koff, parent, st, en, client, stage, tmodel, label, times, taken, ntaken
):
    """``_server_time._labelled`` from ``server`` down: the parts' starts, ends, component
    codes and ranks (the rank's tuple as one integer), in the order Python yields them."""
    p_st, p_en, p_comp, p_rank = [0], [0], [0], [0]
    p_st.pop()
    p_en.pop()
    p_comp.pop()
    p_rank.pop()
    # a depth-first walk in Python's order: (span, depth, model) on a stack, children reversed
    stack = [(server, 0, -1)]
    while stack:
        span, depth, model = stack.pop()
        if stage[span] >= 0:
            continue
        if client[span]:
            p_st.append(st[span])
            p_en.append(en[span])
            p_comp.append(CALLS_OUT)
            p_rank.append((3 << 32) + depth)
            continue
        own = tmodel[span]
        got_r, r0, r1 = _pair(times, span, HR0) if depth == 0 else (False, 0, 0)
        got_s, s0, s1 = _pair(times, span, HS0) if depth == 0 else (False, 0, 0)
        marked = False
        if depth == 0 and not (got_r or got_s):
            m0, m1, m2 = times[span, M_RECV], times[span, M_START], times[span, M_SENT]
            marked = m0 != NONE and m1 != NONE and m2 != NONE and m0 <= m1 and m1 <= m2
        if got_r or got_s:
            p_st.append(st[span])
            p_en.append(en[span])
            p_comp.append(FRONTEND)
            p_rank.append(0)
            if got_r:
                p_st.append(r0)
                p_en.append(r1)
                p_comp.append(RECEIVE)
                p_rank.append(4 << 32)
            if got_s:
                p_st.append(s0)
                p_en.append(s1)
                p_comp.append(SEND)
                p_rank.append(4 << 32)
        elif marked:
            m0, m1, m2 = times[span, M_RECV], times[span, M_START], times[span, M_SENT]
            p_st.append(st[span])
            p_en.append(m0)
            p_comp.append(RECEIVE)
            p_rank.append(1)
            p_st.append(m0)
            p_en.append(m1)
            p_comp.append(HANDLER)
            p_rank.append(1)
            p_st.append(m1)
            p_en.append(m2)
            p_comp.append(SEND)
            p_rank.append(1)
        elif own >= 0:
            steps = False
            for i in range(koff[span], koff[span + 1]):
                if tmodel[kids[i]] >= 0:
                    steps = True
            p_st.append(st[span])
            p_en.append(en[span])
            p_comp.append(ENSEMBLE if steps else SCHEDULER)
            p_rank.append((1 << 32) + depth)
            model = own
        elif times[span, C_START] != NONE and model >= 0:
            up = parent[span]
            staged = up >= 0 and _has_stages(up, kids, koff, stage, client, tmodel)
            infer = HAND_OFF if staged else COMPUTE
            rank = (2 << 32) + depth
            a, b = times[span, C_START], times[span, C_IN]
            c, d = times[span, C_OUT], times[span, C_END]
            if a == NONE or b == NONE or c == NONE or d == NONE:
                p_st.append(st[span])
                p_en.append(en[span])
                p_comp.append(-(infer * (1 << 40) + model) - 1)
                p_rank.append(rank)
            else:
                p_st.append(a)
                p_en.append(b)
                p_comp.append(COMPUTE_INPUT)
                p_rank.append(rank)
                p_st.append(b)
                p_en.append(c)
                p_comp.append(-(infer * (1 << 40) + model) - 1)
                p_rank.append(rank)
                p_st.append(c)
                p_en.append(d)
                p_comp.append(COMPUTE_OUTPUT)
                p_rank.append(rank)
        elif depth > 0:
            code = label[span]
            family = SERVER_NAMED
            for i in range(ntaken):
                if taken[i] == code:
                    family = AS_SPAN
            p_st.append(st[span])
            p_en.append(en[span])
            p_comp.append(-(family * (1 << 40) + code) - 1)
            p_rank.append((3 << 32) + depth)
        for i in range(koff[span + 1] - 1, koff[span] - 1, -1):
            stack.append((kids[i], depth + 1, model))
    return p_st, p_en, p_comp, p_rank


@njit(cache=True)
def _parts(p_st, p_en, p_comp, p_rank, held_a, held_b, lo, hi):  # type: ignore[no-untyped-def]
    """``_server_time.parts``' sweep: each instant of [lo, hi) to the highest-ranked open part
    where no stage or queue holds it; the parts' codes and seconds in order of first time."""
    count = 0
    for i in range(len(p_st)):
        if p_en[i] > p_st[i]:
            count += 2
    for i in range(len(held_a)):
        if held_b[i] > held_a[i]:
            count += 2
    e_t = np.empty(count, np.int64)
    e_s = np.empty(count, np.int64)
    e_i = np.empty(count, np.int64)
    n = 0
    for i in range(len(p_st)):
        if p_en[i] > p_st[i]:
            e_t[n], e_s[n], e_i[n] = p_st[i], 1, i
            e_t[n + 1], e_s[n + 1], e_i[n + 1] = p_en[i], 0, i
            n += 2
    for i in range(len(held_a)):
        if held_b[i] > held_a[i]:
            e_t[n], e_s[n], e_i[n] = held_a[i], 1, -1
            e_t[n + 1], e_s[n + 1], e_i[n + 1] = held_b[i], 0, -1
            n += 2
    order = _sorted3(e_t, e_s, e_i)
    out_c = [0]
    out_v = [0.0]
    out_c.pop()
    out_v.pop()
    open_parts = [0]
    open_parts.pop()
    held = 0
    at = lo
    for j in order:
        time, starts, index = e_t[j], e_s[j], e_i[j]
        now = hi if time > hi else time
        if now > at:
            if held == 0 and len(open_parts) > 0:
                top = open_parts[0]
                for k in open_parts:
                    if p_rank[k] > p_rank[top]:
                        top = k
                comp = p_comp[top]
                found = -1
                for k in range(len(out_c)):
                    if out_c[k] == comp:
                        found = k
                if found < 0:
                    out_c.append(comp)
                    out_v.append(0.0 + (now - at) * _NS)
                else:
                    out_v[found] += (now - at) * _NS
            at = now
        if index < 0:
            held += 1 if starts else -1
        elif starts:
            open_parts.append(index)
        else:
            for k in range(len(open_parts)):
                if open_parts[k] == index:
                    open_parts.pop(k)
                    break
    return out_c, out_v


_HEX = np.full(256, 255, np.uint8)  # a byte's value as a lowercase hex digit (255: none)
_HEX[48:58] = np.arange(10)
_HEX[97:103] = np.arange(10, 16)


@njit(cache=True, nogil=True)
def hex64(offsets, data):  # type: ignore[no-untyped-def]
    """Ids of 16 lowercase hex digits (an Arrow string array's ``offsets`` and ``data``) as
    integers; whether each row is one; whether it is empty."""
    n = len(offsets) - 1
    out = np.zeros(n, np.uint64)
    ok = np.zeros(n, np.bool_)
    empty = np.zeros(n, np.bool_)
    for row in range(n):
        start, end = offsets[row], offsets[row + 1]
        if end == start:
            empty[row] = True
            continue
        if end - start != 16:
            continue
        value = np.uint64(0)
        bad = np.uint8(0)
        for i in range(start, end):
            digit = _HEX[data[i]]
            bad |= digit & np.uint8(0xF0)
            value = (value << np.uint64(4)) | np.uint64(digit & np.uint8(0x0F))
        if bad == 0:
            out[row] = value
            ok[row] = True
    return out, ok, empty


@njit(cache=True, nogil=True)
def last_rows(codes, count):  # type: ignore[no-untyped-def]
    """The row of each code's last appearance in ``codes`` (-1: none)."""
    last = np.full(count, -1, np.int64)
    for row in range(len(codes)):
        last[codes[row]] = row
    return last


@njit(cache=True)
def _cut(items, size):  # type: ignore[no-untyped-def]
    """``items`` cut to its first ``size``."""
    while len(items) > size:
        items.pop()


@njit(cache=True)
def _sorted3(first, second, third):  # type: ignore[no-untyped-def]
    """The order that sorts by ``first``, then ``second``, then ``third`` (ties: as given)."""
    n = len(first)
    if n <= _SMALL:  # a trace's spans, a call's edges: an insertion sort, no allocation
        order = np.arange(n)
        for i in range(1, n):
            j, x = i, order[i]
            while j > 0:
                y = order[j - 1]
                if first[y] < first[x] or (
                    first[y] == first[x]
                    and (second[y] < second[x] or (second[y] == second[x] and third[y] <= third[x]))
                ):
                    break
                order[j] = y
                j -= 1
            order[j] = x
        return order
    order = np.argsort(third, kind="mergesort")
    order = order[np.argsort(second[order], kind="mergesort")]
    return order[np.argsort(first[order], kind="mergesort")]


@njit(cache=True)
def _union_length(a, b):  # type: ignore[no-untyped-def]
    """The nanoseconds ``_breakdown._union`` of the intervals covers."""
    n = len(a)
    if n == 0:
        return 0
    order = _sorted3(np.array(a), np.array(b), np.zeros(n, np.int64))
    total = 0
    cur_a, cur_b = a[order[0]], b[order[0]]
    for j in order[1:]:
        if a[j] <= cur_b:
            if b[j] > cur_b:
                cur_b = b[j]
        else:
            total += cur_b - cur_a
            cur_a, cur_b = a[j], b[j]
    return total + cur_b - cur_a


@njit(cache=True, nogil=True)
def breakdown_chunk(  # type: ignore[no-untyped-def]
    toff,
    perm,
    sid,
    pid,
    hasp,
    st,
    en,
    client,
    odd,
    name,
    stage,
    tmodel,
    called,
    label,
    ser,
    deser,
    conn,
    ev_off,
    ev_code,
    ev_time,
    root_name,
):
    """Every trace of a chunk (its spans' rows ``perm[toff[t]:toff[t + 1]]``, in arrival order):
    the roots'
    rows (trace, place among the trace's roots, root span, first call, incomplete), their
    components (root row, code, seconds, a part or not), their problems (root row, kind,
    model code, call span), which traces are the Python path's, how many spans each holds."""
    ntraces = len(toff) - 1
    r_trace, r_idx, r_span, r_call, r_bad = [0], [0], [0], [0], [False]
    c_root, c_comp, c_val, c_part = [0], [0], [0.0], [False]
    q_root, q_kind, q_model, q_span = [0], [0], [0], [0]
    _cut(r_trace, 0)
    _cut(r_idx, 0)
    _cut(r_span, 0)
    _cut(r_call, 0)
    _cut(r_bad, 0)
    _cut(c_root, 0)
    _cut(c_comp, 0)
    _cut(c_val, 0)
    _cut(c_part, 0)
    _cut(q_root, 0)
    _cut(q_kind, 0)
    _cut(q_model, 0)
    _cut(q_span, 0)
    python = np.zeros(ntraces, np.bool_)
    kept = np.zeros(ntraces, np.int64)
    comps = np.empty(_MAX_COMPONENTS, np.int64)
    vals = np.empty(_MAX_COMPONENTS, np.float64)
    parts = np.empty(_MAX_COMPONENTS, np.bool_)
    for t in range(ntraces):
        lo, hi = toff[t], toff[t + 1]
        n = hi - lo
        rows = perm[lo:hi]
        # the first of duplicate ids wins: keep the earliest arrival of each id
        by_id = _sorted3(sid[rows], np.zeros(n, np.int64), np.arange(n))
        keep = np.ones(n, np.bool_)
        for j in range(1, n):
            if sid[rows[by_id[j]]] == sid[rows[by_id[j - 1]]]:
                keep[by_id[j]] = False
        members = rows[np.nonzero(keep)[0]]
        m = len(members)
        kept[t] = m
        bad = False
        for i in range(n):
            if odd[rows[i]]:
                bad = True
        if bad:
            python[t] = True
            continue
        # in start order (end, then arrival, breaking ties): the order of children and roots
        order = members[_sorted3(st[members], en[members], members)]
        ids = sid[order]
        id_order = _sorted3(ids, np.zeros(m, np.int64), np.arange(m))
        sorted_ids = ids[id_order]
        parent = np.full(m, -1, np.int64)  # local index in ``order``
        for j in range(m):
            g = order[j]
            if hasp[g]:
                k = np.searchsorted(sorted_ids, pid[g])
                if k >= m or sorted_ids[k] != pid[g] or pid[g] == sid[g]:
                    bad = True  # an orphan or its own parent
                    break
                parent[j] = id_order[k]
        if bad:
            python[t] = True
            continue
        koff = np.zeros(m + 1, np.int64)
        for j in range(m):
            if parent[j] >= 0:
                koff[parent[j] + 1] += 1
        for j in range(m):
            koff[j + 1] += koff[j]
        kids = np.empty(koff[m], np.int64)
        fill = koff[:-1].copy()
        for j in range(m):
            if parent[j] >= 0:
                kids[fill[parent[j]]] = j
                fill[parent[j]] += 1
        # a parent cycle reaches no root
        reached = 0
        stack = [j for j in range(m) if parent[j] < 0]
        while stack:
            j = stack.pop()
            reached += 1
            for i in range(koff[j], koff[j + 1]):
                stack.append(kids[i])
        if reached != m:
            python[t] = True
            continue
        # the trace's columns by local index
        l_st, l_en = st[order], en[order]
        l_client, l_stage, l_tmodel = client[order], stage[order], tmodel[order]
        l_label = label[order]
        times = np.full((m, EVENTS), NONE, np.int64)
        for j in range(m):
            g = order[j]
            for e in range(ev_off[g + 1] - 1, ev_off[g] - 1, -1):  # the first wins
                times[j, ev_code[e]] = ev_time[e]
        marks = (len(r_trace), len(c_root), len(q_root))
        index = 0
        for root in range(m):
            if parent[root] >= 0:
                continue
            if root_name != -1 and name[order[root]] != root_name:
                continue
            index += 1
            count = 0
            accounted = 0.0
            # ``answered_by``'s first call: depth first through every span but a call
            first_call = -1
            pending = [kids[i] for i in range(koff[root + 1] - 1, koff[root] - 1, -1)]
            while pending:
                span = pending.pop()
                if l_client[span]:
                    first_call = order[span]
                    break
                for i in range(koff[span + 1] - 1, koff[span] - 1, -1):
                    pending.append(kids[i])
            incomplete = False
            # the client's calls and stages: depth first, through spans of neither kind
            pending = [kids[i] for i in range(koff[root + 1] - 1, koff[root] - 1, -1)]
            while pending:
                span = pending.pop()
                g = order[span]
                if l_client[span]:
                    dur = (l_en[span] - l_st[span]) * _NS
                    accounted += dur
                    s, d = ser[g], deser[g]
                    count = _add(comps, vals, parts, count, SERIALIZE, s, False)
                    count = _add(comps, vals, parts, count, DESERIALIZE, d, False)
                    if koff[span] == koff[span + 1]:
                        count = _add(comps, vals, parts, count, NO_SERVER, dur, False)
                        incomplete = True
                        continue
                    server = kids[koff[span]]
                    c = conn[g]
                    if c != 0.0:
                        count = _add(comps, vals, parts, count, CONNECTION, c, False)
                    # ``around``: the server's receive, frontend and send outside its span
                    sent = l_st[span] + np.int64(np.rint((s + c) / _NS))
                    outside = 0.0
                    got, r0, r1 = _pair(times, server, HR0)
                    if got and r0 < l_st[server]:
                        a = max(r0, sent)
                        b = min(r1, l_st[server])
                        if b > a:
                            outside += (b - a) * _NS
                            count = _add(comps, vals, parts, count, RECEIVE, (b - a) * _NS, True)
                        front = l_st[server] - max(b, sent)
                        if front > 0:
                            outside += front * _NS
                            count = _add(comps, vals, parts, count, FRONTEND, front * _NS, True)
                    got, s0, s1 = _pair(times, server, HS0)
                    if got and s1 > l_en[server]:
                        a = max(s0, l_en[server])
                        b = min(s1, l_en[span])
                        if b > a:
                            outside += (b - a) * _NS
                            count = _add(comps, vals, parts, count, SEND, (b - a) * _NS, True)
                    end_ns = min(l_en[server], l_en[span])
                    wire = ((l_en[span] - l_st[span]) - (end_ns - l_st[server])) * _NS - s - d
                    count = _add(comps, vals, parts, count, NETWORK, wire - c - outside, False)
                    # the server's subtree: the queue's intervals, the outermost stages
                    q_a, q_b = [0], [0]
                    q_a.pop()
                    q_b.pop()
                    walk = [server]
                    while walk:
                        x = walk.pop()
                        queued = times[x, Q_START]
                        if queued != NONE:
                            for i in range(koff[x], koff[x + 1]):
                                started = times[kids[i], C_START]
                                if started != NONE:
                                    q_a.append(queued)
                                    q_b.append(max(queued, started))
                                    break
                        for i in range(koff[x + 1] - 1, koff[x] - 1, -1):
                            walk.append(kids[i])
                    queue = _union_length(q_a, q_b) * _NS
                    count = _add(comps, vals, parts, count, QUEUE, queue, False)
                    staged = 0.0
                    held_a, held_b = list(q_a), list(q_b)
                    taken = np.empty(koff[m], np.int64)
                    ntaken = 0
                    walk = [kids[i] for i in range(koff[server + 1] - 1, koff[server] - 1, -1)]
                    while walk:
                        x = walk.pop()
                        if l_stage[x] >= 0:
                            sd = (l_en[x] - l_st[x]) * _NS
                            staged += sd
                            held_a.append(l_st[x])
                            held_b.append(l_en[x])
                            taken[ntaken] = l_stage[x]
                            ntaken += 1
                            code = SERVER_NAMED * (1 << 40) + l_stage[x]
                            count = _add(comps, vals, parts, count, -code - 1, sd, False)
                        elif not l_client[x]:
                            for i in range(koff[x + 1] - 1, koff[x] - 1, -1):
                                walk.append(kids[i])
                    if count < 0:
                        break
                    labels = _labelled(
                        server,
                        kids,
                        koff,
                        parent,
                        l_st,
                        l_en,
                        l_client,
                        l_stage,
                        l_tmodel,
                        l_label,
                        times,
                        taken,
                        ntaken,
                    )
                    top = min(end_ns, l_en[server])
                    f_c, f_v = _parts(
                        labels[0],
                        labels[1],
                        labels[2],
                        labels[3],
                        held_a,
                        held_b,
                        l_st[server],
                        top,
                    )
                    found = 0.0
                    for k in range(len(f_c)):
                        found += f_v[k]
                        count = _add(comps, vals, parts, count, f_c[k], f_v[k], True)
                    served = (top - l_st[server]) * _NS
                    other = served - queue - staged - found
                    count = _add(comps, vals, parts, count, SERVER_OTHER, other, False)
                    if l_st[server] < l_st[span]:
                        q_root.append(len(r_trace))
                        q_kind.append(_PROBLEM_START)
                        q_model.append(called[g])
                        q_span.append(g)
                    if staged + queue > (l_en[server] - l_st[server]) * _NS * (1 + 1e-6):
                        q_root.append(len(r_trace))
                        q_kind.append(_PROBLEM_EXCEED)
                        q_model.append(called[g])
                        q_span.append(g)
                elif l_stage[span] >= 0:
                    dur = (l_en[span] - l_st[span]) * _NS
                    accounted += dur
                    code = CLIENT_STAGE * (1 << 40) + l_stage[span]
                    count = _add(comps, vals, parts, count, -code - 1, dur, False)
                else:
                    for i in range(koff[span + 1] - 1, koff[span] - 1, -1):
                        pending.append(kids[i])
                if count < 0:
                    break
            if count < 0:
                bad = True
                break
            total = (l_en[root] - l_st[root]) * _NS
            count = _add(comps, vals, parts, count, CLIENT_OTHER, total - accounted, False)
            count = _add(comps, vals, parts, count, TOTAL, total, False)
            if count < 0:
                bad = True
                break
            row = len(r_trace)
            r_trace.append(t)
            r_idx.append(index)
            r_span.append(order[root])
            r_call.append(first_call)
            r_bad.append(incomplete)
            for k in range(count):
                c_root.append(row)
                c_comp.append(comps[k])
                c_val.append(vals[k])
                c_part.append(parts[k])
        if bad:  # too many components: forget what the trace left, the Python path's
            python[t] = True
            a, b, c = marks
            _cut(r_trace, a)
            _cut(r_idx, a)
            _cut(r_span, a)
            _cut(r_call, a)
            _cut(r_bad, a)
            _cut(c_root, b)
            _cut(c_comp, b)
            _cut(c_val, b)
            _cut(c_part, b)
            _cut(q_root, c)
            _cut(q_kind, c)
            _cut(q_model, c)
            _cut(q_span, c)
    return (
        (np.array(r_trace), np.array(r_idx), np.array(r_span), np.array(r_call), np.array(r_bad)),
        (np.array(c_root), np.array(c_comp), np.array(c_val), np.array(c_part)),
        (np.array(q_root), np.array(q_kind), np.array(q_model), np.array(q_span)),
        python,
        kept,
    )
