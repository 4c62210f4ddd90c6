"""A float64 numpy OLMoE forward (transformers 5.17's OlmoeForCausalLM, text, no cache), for the
case transformers' fixtures do not cover: clip_qkv (q, k, v clamped after the full-width q/k norms,
before RoPE). It agrees with tests/fixtures/fam/olmoe_a/logits.f32 to 2.6e-7 without clipping.

  /usr/bin/python3 tools/lab/olmoe_ref.py MODEL_DIR IDS(comma-separated) OUT.f32

tests/unit/data/olmoe_clip_tail.f32 is the last 4 rows of its logits for olmoe_a's weights with
"clip_qkv": 0.6 and olmoe_a's 40 prompt ids (test_route.c's test_olmoe_clip_qkv).
"""
import json, struct, sys, numpy as np
d=sys.argv[1]; ids=[int(x) for x in sys.argv[2].split(',')]
c=json.load(open(d+'/config.json'))
f=open(d+'/model.safetensors','rb'); n=struct.unpack('<Q',f.read(8))[0]; h=json.loads(f.read(n)); base=8+n
def T(name):
    m=h['model.'+name] if 'model.'+name in h else h[name]
    f.seek(base+m['data_offsets'][0]); b=f.read(m['data_offsets'][1]-m['data_offsets'][0])
    if m['dtype']=='BF16':
        a=np.frombuffer(b,dtype=np.uint16).astype(np.uint32)<<16; a=a.view(np.float32)
    else: a=np.frombuffer(b,dtype=np.float32)
    return a.astype(np.float64).reshape(m['shape'])
H=c['hidden_size']; nh=c['num_attention_heads']; nkv=c['num_key_value_heads']; hd=H//nh
eps=c['rms_norm_eps']; E=c['num_experts']; k=c['num_experts_per_tok']; clip=c.get('clip_qkv')
theta=c['rope_parameters']['rope_theta']
def rms(x,w): return x/np.sqrt((x*x).mean(-1,keepdims=True)+eps)*w
Tn=len(ids); x=T('embed_tokens.weight')[ids]
inv=1.0/theta**(np.arange(0,hd,2)/hd); pos=np.arange(Tn)[:,None]*inv[None]; cos=np.cos(np.concatenate([pos,pos],-1)); sin=np.sin(np.concatenate([pos,pos],-1))
def rope(q):  # q [T, heads, hd]
    x1=q[...,:hd//2]; x2=q[...,hd//2:]; rot=np.concatenate([-x2,x1],-1)
    return q*cos[:,None]+rot*sin[:,None]
for l in range(c['num_hidden_layers']):
    p='layers.%d.'%l
    a=rms(x,T(p+'input_layernorm.weight'))
    q=a@T(p+'self_attn.q_proj.weight').T; kk=a@T(p+'self_attn.k_proj.weight').T; v=a@T(p+'self_attn.v_proj.weight').T
    q=rms(q,T(p+'self_attn.q_norm.weight')); kk=rms(kk,T(p+'self_attn.k_norm.weight'))
    if clip: q=np.clip(q,-clip,clip); kk=np.clip(kk,-clip,clip); v=np.clip(v,-clip,clip)
    q=rope(q.reshape(Tn,nh,hd)); kk=rope(kk.reshape(Tn,nkv,hd)); v=v.reshape(Tn,nkv,hd)
    o=np.zeros((Tn,nh,hd))
    for hh in range(nh):
        g=hh//(nh//nkv); s=q[:,hh]@kk[:,g].T/np.sqrt(hd); s=s+np.triu(np.full((Tn,Tn),-np.inf),1)
        s=np.exp(s-s.max(-1,keepdims=True)); s/=s.sum(-1,keepdims=True); o[:,hh]=s@v[:,g]
    x=x+o.reshape(Tn,-1)@T(p+'self_attn.o_proj.weight').T
    a=rms(x,T(p+'post_attention_layernorm.weight'))
    lg=a@T(p+'mlp.gate.weight').T; pr=np.exp(lg-lg.max(-1,keepdims=True)); pr/=pr.sum(-1,keepdims=True)
    out=np.zeros_like(x)
    for t in range(Tn):
        top=np.argsort(-pr[t],kind='stable')[:k]; w=pr[t][top]
        if c.get('norm_topk_prob'): w=w/w.sum()
        for e,we in zip(top,w):
            q_='mlp.experts.%d.'%e
            gg=a[t]@T(p+q_+'gate_proj.weight').T; uu=a[t]@T(p+q_+'up_proj.weight').T
            out[t]+=we*((gg/(1+np.exp(-gg))*uu)@T(p+q_+'down_proj.weight').T)
    x=x+out
x=rms(x,T('norm.weight')); lo=x@T('lm_head.weight').T
lo.astype(np.float32).tofile(sys.argv[3])
