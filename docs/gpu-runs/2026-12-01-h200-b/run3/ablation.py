import sys
v = sys.argv[1]
p='kernel_src/quant/swiglu.py'
s=open(p).read()
def rep(a, b):
    global s
    assert a in s, a[:80]
    s = s.replace(a, b)
if v in ('e1', 'e3'):
    rep("""            T.evaluate(T.call_extern('void', 'tk_silu_lookup_bf16x8', T.address_of(gate[j, 0]),
                                     T.address_of(silu_table[0]), T.address_of(act[j, 0])))""",
        """            for e in T.unroll(epv):
                act[j, e] = T.float32(1)""")
if v in ('e2', 'e3'):
    rep("""                            T.evaluate(T.call_extern('void', 'tk_track_gate_bits_bf16x8', T.address_of(gate[j, 0]),
                                                     T.address_of(gate_bits[0]), T.address_of(gate_bits[1])))
""", "")
    rep("""                        if T.call_extern('int32', 'tk_gate_bits_in_table', gate_bits[0], gate_bits[1]) != 0:""",
        """                        if round_sf != 12345:""")
if v == 'e3':
    rep("""                            if count_clamp != 0:
                                T.evaluate(T.call_extern('void', 'tk_track_reach_bf16x8',""", """                            if count_clamp == 12345:
                                T.evaluate(T.call_extern('void', 'tk_track_reach_bf16x8',""")
open(p,'w').write(s)
