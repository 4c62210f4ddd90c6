// Drives `sluice serve` with the official OpenAI Node.js client (tests/server/server_test.sh).
//
//   node client.mjs api  BASE_URL         the API through the client: models, chat and
//                                         completions, streaming and not, stop, seeds, errors
//   node client.mjs load BASE_URL N C     N chat requests, C at a time, half of them streamed
//   node client.mjs abort BASE_URL        opens a long stream and drops it after 3 chunks
//   node client.mjs stream BASE_URL       one short stream, read to its end (the test queues
//                                         it behind a long request: ': keep-alive' comments)
//
// Prints "ok NAME" / "FAIL NAME ..." lines; exits non-zero on any failure.
import OpenAI from "openai";

const [mode, baseURL, ...rest] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: process.env.SLUICE_API_KEY || "none", maxRetries: 0, timeout: 30000 });
let failed = 0;
const ok = (name) => console.log(`ok   ${name}`);
const bad = (name, why) => { failed++; console.log(`FAIL ${name}: ${why}`); };
const check = (name, cond, why) => (cond ? ok(name) : bad(name, why));

const messages = [
  { role: "system", content: "You are terse." },
  { role: "user", content: "Name three rivers." },
];

async function collect(stream) {
  let text = "", finish = null, usage = null, role = null, chunks = 0;
  for await (const c of stream) {
    chunks++;
    if (c.usage) usage = c.usage;
    const ch = c.choices[0];
    if (!ch) continue;
    if (ch.delta) {
      if (ch.delta.role) role = ch.delta.role;
      text += ch.delta.content ?? "";
    } else {
      text += ch.text ?? "";
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  return { text, finish, usage, role, chunks };
}

async function api() {
  const models = await client.models.list();
  check("models.list", models.data.length === 1 && models.data[0].object === "model" && models.data[0].max_model_len > 0, JSON.stringify(models.data));
  const model = models.data[0].id;

  const req = { model, messages, max_tokens: 8, temperature: 0 };
  const a = await client.chat.completions.create(req);
  const c0 = a.choices[0];
  check("chat: response shape",
    a.id.startsWith("chatcmpl-") && a.object === "chat.completion" && a.model === model &&
      c0.message.role === "assistant" && typeof c0.message.content === "string" &&
      ["stop", "length"].includes(c0.finish_reason),
    JSON.stringify(a));
  check("chat: usage",
    a.usage.prompt_tokens > 0 && a.usage.completion_tokens <= 8 &&
      a.usage.total_tokens === a.usage.prompt_tokens + a.usage.completion_tokens &&
      (c0.finish_reason !== "length" || a.usage.completion_tokens === 8),
    JSON.stringify(a.usage));
  const b = await client.chat.completions.create(req);
  check("chat: temperature 0 is reproducible (and reuses the KV cache)",
    b.choices[0].message.content === c0.message.content && b.usage.prompt_tokens_details.cached_tokens > 0,
    JSON.stringify(b));

  const s = await collect(await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } }));
  check("chat stream: same text, role first, finish_reason, usage last",
    s.text === c0.message.content && s.role === "assistant" && s.finish === c0.finish_reason &&
      s.usage && s.usage.completion_tokens === a.usage.completion_tokens,
    JSON.stringify(s));
  const s2 = await collect(await client.chat.completions.create({ ...req, stream: true }));
  check("chat stream without usage", s2.text === c0.message.content && s2.usage === null, JSON.stringify(s2));

  // max_completion_tokens, and a longer reply for the stop test.
  const long = await client.chat.completions.create({ model, messages, max_completion_tokens: 24, temperature: 0 });
  const lt = long.choices[0].message.content;
  check("max_completion_tokens", long.usage.completion_tokens <= 24 && lt.length > 0, JSON.stringify(long));
  const chars = [...lt];
  const stop = chars.slice(4, 6).join("");
  const cut = lt.indexOf(stop);
  const st = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0, stop: [stop] });
  check("stop: the reply ends before the stop string",
    st.choices[0].finish_reason === "stop" && st.choices[0].message.content === lt.slice(0, cut),
    `stop ${JSON.stringify(stop)} in ${JSON.stringify(lt)}: ${JSON.stringify(st.choices[0])}`);
  const sst = await collect(await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0, stop, stream: true }));
  check("stop while streaming", sst.finish === "stop" && sst.text === lt.slice(0, cut), JSON.stringify(sst));

  // Sampling: the same seed gives the same text; penalties and top_p are accepted.
  const sampled = (seed) => client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 1.2, top_p: 0.95, seed, presence_penalty: 0.5, frequency_penalty: 0.5 });
  const [x1, x2, x3] = [await sampled(7), await sampled(7), await sampled(8)];
  check("seed: same seed, same text; another seed, another text",
    x1.choices[0].message.content === x2.choices[0].message.content &&
      x1.choices[0].message.content !== x3.choices[0].message.content,
    [x1, x2, x3].map((x) => x.choices[0].message.content).join(" | "));

  // Legacy completions, streamed and not.
  const p = await client.completions.create({ model, prompt: "The river", max_tokens: 6, temperature: 0 });
  check("completions", p.object === "text_completion" && p.choices[0].text.length > 0 && p.usage.completion_tokens <= 6, JSON.stringify(p));
  const ps = await collect(await client.completions.create({ model, prompt: "The river", max_tokens: 6, temperature: 0, stream: true }));
  check("completions stream", ps.text === p.choices[0].text && ps.finish === p.choices[0].finish_reason, JSON.stringify(ps));

  // Issue 29 through the client: logprobs (chat and completions, streamed and not), logit_bias.
  const lq = await client.chat.completions.create({ ...req, logprobs: true, top_logprobs: 3 });
  const lc = lq.choices[0].logprobs?.content ?? [];
  check("chat logprobs: one entry per token, top_logprobs of 3, the greedy token first",
    lc.length === lq.usage.completion_tokens &&
      lc.every((e) => e.top_logprobs.length === 3 && e.top_logprobs[0].token === e.token &&
        e.logprob <= 0 && Array.isArray(e.bytes)),
    JSON.stringify(lq.choices[0]));
  let ls = [];
  for await (const c of await client.chat.completions.create({ ...req, logprobs: true, top_logprobs: 3, stream: true }))
    ls = ls.concat(c.choices[0]?.logprobs?.content ?? []);
  check("chat logprobs streamed", JSON.stringify(ls) === JSON.stringify(lc), `${ls.length} vs ${lc.length}`);
  const lp = await client.completions.create({ model, prompt: "The river", max_tokens: 4, temperature: 0, logprobs: 2 });
  const lpp = lp.choices[0].logprobs;
  check("completions logprobs: tokens, token_logprobs, top_logprobs, text_offset",
    lpp && lpp.tokens.length === lp.usage.completion_tokens && lpp.token_logprobs.length === lpp.tokens.length &&
      lpp.top_logprobs.every((t) => Object.keys(t).length >= 1) && lpp.text_offset[0] === 0,
    JSON.stringify(lp.choices[0]));
  const forced = await client.completions.create({ model, prompt: "The river", max_tokens: 3, temperature: 0, logit_bias: { "14796": 100 } });
  check("logit_bias +100 forces the token", forced.choices[0].text === " river river river", JSON.stringify(forced.choices[0]));
  try {
    await client.chat.completions.create({ model, messages, logit_bias: { "abc": 1 } });
    bad("logit_bias with a key that is not an id is refused", "no error");
  } catch (e) {
    check("logit_bias with a key that is not an id is refused (BadRequestError)", e.status === 400 && e.param === "logit_bias", String(e));
  }

  // Errors arrive as the client's typed errors.
  try {
    await client.chat.completions.create({ model, messages, n: 2 });
    bad("n=2 is refused", "no error");
  } catch (e) {
    check("n=2 is refused (BadRequestError, OpenAI error object)", e instanceof OpenAI.BadRequestError && e.status === 400 && /n=1/.test(e.message), String(e));
  }
  try {
    await client.chat.completions.create({ model, messages: [{ role: "user", content: "x ".repeat(5000) }] });
    bad("a prompt longer than the context is refused", "no error");
  } catch (e) {
    check("a prompt longer than the context is refused", e.status === 400 && e.code === "context_length_exceeded", String(e));
  }
}

async function load(n, c) {
  let next = 0, fails = 0, done = 0;
  const one = async (i) => {
    const req = { model: "m", messages: [{ role: "user", content: `Request ${i % 13}: say something.` }], max_tokens: 4 + (i % 5), temperature: i % 3 ? 0.8 : 0, top_k: 40, seed: i };
    if (i % 2) {
      const r = await collect(await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } }));
      if (!r.finish || !r.usage) throw new Error(`stream ${i} ended without finish_reason/usage`);
    } else {
      const r = await client.chat.completions.create(req);
      if (!r.choices[0].finish_reason) throw new Error(`request ${i} without finish_reason`);
    }
  };
  const worker = async () => {
    while (next < n) {
      const i = next++;
      try { await one(i); done++; } catch (e) { fails++; if (fails < 5) console.log(`request ${i}: ${e}`); }
    }
  };
  const t0 = Date.now();
  await Promise.all(Array.from({ length: c }, worker));
  check(`load: ${n} requests, ${c} at a time, ${done} done in ${((Date.now() - t0) / 1000).toFixed(1)} s, ${fails} failed`, fails === 0 && done === n, "failures");
}

async function abort() {
  const controller = new AbortController();
  const stream = await client.chat.completions.create({ model: "m", messages, max_tokens: 100000, temperature: 0, ignore_eos: true, stream: true }, { signal: controller.signal });
  let chunks = 0;
  try {
    for await (const _ of stream) if (++chunks === 3) controller.abort();
  } catch (e) { /* the abort */ }
  check("abort a stream after 3 chunks", chunks >= 3, `${chunks} chunks`);
}

async function stream() {
  const s = await collect(await client.chat.completions.create({ model: "m", messages, max_tokens: 4, temperature: 0, stream: true }));
  check("a stream that waited in the queue (keep-alive comments) reads to its end", s.finish && s.role === "assistant", JSON.stringify(s));
}

try {
  if (mode === "api") await api();
  else if (mode === "stream") await stream();
  else if (mode === "load") await load(Number(rest[0]), Number(rest[1]));
  else if (mode === "abort") await abort();
  else throw new Error(`unknown mode ${mode}`);
} catch (e) {
  bad(mode, e.stack || String(e));
}
process.exit(failed ? 1 : 0);
