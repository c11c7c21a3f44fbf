import json,sys,glob,statistics
for d in sys.argv[1:]:
    f=sorted(glob.glob(d+'/*/records/rank-0.jsonl'))[-1]
    st=[json.loads(l) for l in open(f) if '"step"' in l]
    st=[r for r in st if r.get('kind')=='step' and not r.get('warmup')]
    m=lambda k: statistics.median([(r.get(k) or 0) for r in st])*1e3
    print(d.split('/')[-1], 'n',len(st),'step %.1f data %.1f fwd %.1f bwd %.1f exch %.1f opt %.1f wps %.0f'%(m('step_s'),m('data_s'),m('forward_s'),m('backward_s'),m('exchange_s'),m('optimizer_s'), statistics.median([r['words']/r['step_s'] for r in st])))
