import json, sys
for path in sys.argv[1:]:
    print(path)
    for s in json.load(open(path)):
        r = s.get('remat')
        if not r: continue
        print(s['step'], round(s['step_ms'], 1), 'rec %.0fMB' % (r['recomputed_bytes']/1e6), 'n', r['recomputes'],
              'off %.0fMB' % (r['offloaded_bytes']/1e6), 'up %.0fMB' % (r['uploaded_bytes']/1e6),
              'batches', r['offload_batches'], 'offwait %.1fms' % (r['offload_nanos']/1e6),
              'upl %.1fms' % (r['upload_nanos']/1e6), 'search %.1fms' % (r['search_nanos']/1e6),
              'room', r['room_rounds'], 'budget', r['budget_rounds'], 'evict', r['evictions'])
