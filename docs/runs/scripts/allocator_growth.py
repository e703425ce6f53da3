#!/usr/bin/env python3
"""Reads a gpt --out folder (memory.json, memory_viz.pickle from frugal-cuda) and prints, for
the recorded step, the allocator's events by kind, the bytes in live blocks at each segment
growth (when CubeCL's free slots were just handed back, so these are the bytes really held),
and the ledger's peak live bytes. Used for the diagnosis of 2026-11-27 (runs 2026-11-27-h200-allocator-trace and -2)."""
import collections, json, pickle, sys

folder = sys.argv[1]
ledger = json.load(open(folder + '/memory.json'))['events']
viz = pickle.load(open(folder + '/memory_viz.pickle', 'rb'))
trace = viz['device_traces'][0]
end = sum(b['size'] for s in viz['segments'] for b in s['blocks'] if b['state'] == 'active_allocated')
net = sum(e['size'] if e['action'] == 'alloc' else -e['size'] if e['action'] == 'free_completed' else 0 for e in trace)
print('events', dict(collections.Counter(e['action'] for e in trace)))
print('reserved at the end', sum(s['total_size'] for s in viz['segments']))
print('ledger: live at the start', ledger[0]['live_bytes'] - ledger[0]['bytes'], 'peak', max(e['live_bytes'] for e in ledger))
allocated = end - net
print('allocator: allocated at the start', allocated)
for e in trace:
    if e['action'] == 'alloc':
        allocated += e['size']
    elif e['action'] == 'free_completed':
        allocated -= e['size']
    elif e['action'].startswith('segment'):
        print(' ', e['action'], e['size'], 'allocated then', allocated)
