"""Prints one line per burn-nn-models run in a results folder (its .out files' JSON lines):
first step, medians, peaks against the budget, what the budget moved, and split changes."""
import glob
import json
import os
import sys

for f in sorted(glob.glob(os.path.join(sys.argv[1], '*.out'))):
    for line in open(f):
        if not line.startswith('{'):
            continue
        d = json.loads(line)
        print(os.path.basename(f)[:-4], 'first %.0f ms' % d['first_step_ms'],
              'median %.2f, second half %.2f ms' % (d['median_ms'], d['late_median_ms']),
              'steps', [round(s, 1) for s in d['step_ms']],
              'peak', d['peak_live'], 'steady', d['steady_peak_live'], 'budget', d['budget'],
              'reserved', d['allocator_peak_reserved'], 'recomputed', d['recomputed_bytes'],
              'offloaded', d['offloaded_bytes'], 'op floor', d['plan_op_floor'],
              'later compiled', d.get('later_compiled'), 'split', d['micro_batches'],
              'loss %.4f->%.4f' % (d['losses'][0], d['losses'][-1]))
        for c in d['split_changes']:
            print('   ', c)
