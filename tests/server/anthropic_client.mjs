// Drives `sluice serve`'s /v1/messages with the official Anthropic Node.js client
// (tests/server/server_test.sh).
//
//   node anthropic_client.mjs api  BASE_URL   messages streamed and not, multi-turn with a
//                                             system prompt, stop_sequences, max_tokens,
//                                             countTokens, tools, errors
//   node anthropic_client.mjs key  BASE_URL   the key as x-api-key and as a bearer token
//                                             ($SLUICE_API_KEY), and a wrong one
//
// Prints "ok NAME" / "FAIL NAME ..." lines; exits non-zero on any failure.
import Anthropic from "@anthropic-ai/sdk";

const [mode, baseURL] = process.argv.slice(2);
const opts = { baseURL, maxRetries: 0, timeout: 30000 };
const client = new Anthropic({ ...opts, apiKey: process.env.SLUICE_API_KEY || "none" });
let failed = 0;
const ok = (name) => console.log(`ok   ${name}`);
const bad = (name, why) => { failed++; console.log(`FAIL ${name}: ${why}`); };
const check = (name, cond, why) => (cond ? ok(name) : bad(name, why));

const system = [{ type: "text", text: "You are terse." }, { type: "text", text: "Answer in English." }];
const messages = [
  { role: "user", content: "Name a river." },
  { role: "assistant", content: [{ type: "text", text: "The Loire." }] },
  { role: "user", content: [{ type: "text", text: "Another one?" }] },
];
const text = (m) => m.content.filter((b) => b.type === "text").map((b) => b.text).join("");

// The raw event stream (create with stream: true): names in order, text, the final message_delta.
async function events(req) {
  const names = [];
  let t = "", delta = null, start = null;
  for await (const e of await client.messages.create({ ...req, stream: true })) {
    names.push(e.type);
    if (e.type === "message_start") start = e.message;
    if (e.type === "content_block_delta" && e.delta.type === "text_delta") t += e.delta.text;
    if (e.type === "message_delta") delta = e;
  }
  return { names, text: t, delta, start };
}

async function api() {
  const req = { model: "sluice", max_tokens: 8, temperature: 0, system, messages, metadata: { user_id: "u1" } };
  const a = await client.messages.create(req);
  check("messages: response shape",
    a.id.startsWith("msg_") && a.type === "message" && a.role === "assistant" &&
      a.content.length === 1 && a.content[0].type === "text" && typeof a.content[0].text === "string" &&
      ["end_turn", "max_tokens"].includes(a.stop_reason) && a.stop_sequence === null,
    JSON.stringify(a));
  check("messages: usage",
    a.usage.input_tokens > 20 && a.usage.output_tokens <= 8 &&
      (a.stop_reason !== "max_tokens" || a.usage.output_tokens === 8),
    JSON.stringify(a.usage));
  const n = await client.messages.countTokens({ model: "sluice", system, messages });
  check("countTokens: the input_tokens a message reports", n.input_tokens === a.usage.input_tokens,
    `${JSON.stringify(n)} vs ${a.usage.input_tokens}`);
  const b = await client.messages.create(req);
  check("messages: temperature 0 is reproducible", text(b) === text(a), `${text(a)} | ${text(b)}`);

  // Streaming: the event sequence, as the raw events and through the client's MessageStream.
  const s = await events(req);
  const seq = s.names.filter((n) => n !== "content_block_delta" && n !== "ping").join(",");
  check("stream: message_start, content_block_start, deltas, content_block_stop, message_delta, message_stop",
    seq === "message_start,content_block_start,content_block_stop,message_delta,message_stop" &&
      s.names.includes("content_block_delta") === (text(a).length > 0),
    s.names.join(","));
  check("stream: same text, stop_reason and usage",
    s.text === text(a) && s.delta.delta.stop_reason === a.stop_reason &&
      s.delta.usage.output_tokens === a.usage.output_tokens &&
      s.start.usage.input_tokens === a.usage.input_tokens && s.start.id.startsWith("msg_"),
    JSON.stringify(s));
  const ms = client.messages.stream(req);
  let streamed = "";
  ms.on("text", (t) => { streamed += t; });
  const fin = await ms.finalMessage();
  check("stream: the client's MessageStream assembles the same message",
    streamed === text(a) && text(fin) === text(a) && fin.stop_reason === a.stop_reason &&
      fin.usage.output_tokens === a.usage.output_tokens,
    JSON.stringify(fin));

  // max_tokens: a longer reply that reaches it, then stop_sequences cutting it.
  const long = await client.messages.create({ ...req, max_tokens: 24, temperature: 0, top_k: 40, top_p: 0.9 });
  const lt = text(long);
  check("max_tokens: stop_reason max_tokens at exactly max_tokens",
    long.stop_reason === "max_tokens" && long.usage.output_tokens === 24 && lt.length > 0,
    JSON.stringify(long));
  const stop = [...lt].slice(4, 6).join("");
  const cut = lt.indexOf(stop);
  const st = await client.messages.create({ ...req, max_tokens: 24, stop_sequences: ["zzqq-never", stop] });
  check("stop_sequences: stop_reason stop_sequence, the string named, the text before it",
    st.stop_reason === "stop_sequence" && st.stop_sequence === stop && text(st) === lt.slice(0, cut),
    `stop ${JSON.stringify(stop)} in ${JSON.stringify(lt)}: ${JSON.stringify(st)}`);
  const sst = await events({ ...req, max_tokens: 24, stop_sequences: [stop] });
  check("stop_sequences while streaming",
    sst.text === lt.slice(0, cut) && sst.delta.delta.stop_reason === "stop_sequence" &&
      sst.delta.delta.stop_sequence === stop,
    JSON.stringify(sst));

  // Errors arrive as the client's typed errors, with Anthropic's error body.
  const refused = async (name, r, cls, pattern) => {
    try {
      await client.messages.create(r);
      bad(name, "no error");
    } catch (e) {
      check(name, e instanceof cls && e.status === 400 && e.error?.type === "error" &&
        e.error?.error?.type === "invalid_request_error" && pattern.test(e.error.error.message), String(e));
    }
  };
  await refused("an image block: 400 naming it", { ...req, messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "AAAA" } }] }] },
    Anthropic.BadRequestError, /'image' are not supported/);
  await refused("tool_choice any: 400", { ...req, tools, tool_choice: { type: "any" } },
    Anthropic.BadRequestError, /constrained decoding/);
  await refused("tool_choice tool: 400", { ...req, tools, tool_choice: { type: "tool", name: "get_weather" } },
    Anthropic.BadRequestError, /constrained decoding/);
  await refused("a tool_result block in an assistant message: 400",
    { ...req, messages: [{ role: "assistant", content: [{ type: "tool_result", tool_use_id: "t", content: "x" }] }, { role: "user", content: "Hi" }] },
    Anthropic.BadRequestError, /'tool_result' are not supported yet in an assistant message/);
  await refused("a prompt longer than the context: 400", { ...req, messages: [{ role: "user", content: "x ".repeat(5000) }] },
    Anthropic.BadRequestError, /maximum context length/);
}

// Tools: a conversation with tool_use and tool_result blocks is accepted and rendered as the
// OpenAI route renders the same conversation (server_test.sh compares the prompts' ids); the
// tiny model writes no calls, so a reply that opens "<tool_call>" (forced with logit_bias, a
// sluice extension) and never closes it comes back as text, streamed or not.
const tools = [{ name: "get_weather", description: "Current weather in a city.",
  input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } }];
async function toolUse() {
  const history = [
    { role: "user", content: "Weather in Paris and Rome?" },
    { role: "assistant", content: [{ type: "text", text: "Looking." },
      { type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Paris" } },
      { type: "tool_use", id: "toolu_2", name: "get_weather", input: { city: "Rome" } }] },
    { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: "18 C" },
      { type: "tool_result", tool_use_id: "toolu_2", content: [{ type: "text", text: "21 C" }], is_error: false },
      { type: "text", text: "And Oslo?" }] },
  ];
  const req = { model: "sluice", max_tokens: 3, temperature: 0, tools, tool_choice: { type: "auto" }, messages: history };
  const a = await client.messages.create(req);
  check("tools: a conversation with tool_use and tool_result blocks",
    a.type === "message" && ["end_turn", "max_tokens", "tool_use"].includes(a.stop_reason), JSON.stringify(a));
  const n = await client.messages.countTokens({ model: "sluice", tools, messages: history });
  check("tools: countTokens counts the tools' prompt", n.input_tokens === a.usage.input_tokens,
    `${JSON.stringify(n)} vs ${a.usage.input_tokens}`);
  const forced = { ...req, messages: [{ role: "user", content: "x" }], logit_bias: { 151657: 100 } };
  const f = await client.messages.create(forced);
  const s = await events(forced);
  check("tools: an unfinished <tool_call> is text, streamed the same",
    text(f) === "<tool_call><tool_call><tool_call>" && f.stop_reason === "max_tokens" &&
      s.text === text(f) && s.delta.delta.stop_reason === "max_tokens",
    `${JSON.stringify(f)} / ${JSON.stringify(s)}`);
  const ms = client.messages.stream({ ...req, tool_choice: { type: "none" } });
  const fin = await ms.finalMessage();
  check("tools: tool_choice none, through MessageStream", fin.type === "message" && fin.stop_reason !== "tool_use",
    JSON.stringify(fin));
}

async function key() {
  const viaHeader = await client.messages.create({ model: "m", max_tokens: 2, messages: [{ role: "user", content: "Hi" }] });
  check("API key as x-api-key", viaHeader.type === "message", JSON.stringify(viaHeader));
  const bearer = new Anthropic({ ...opts, apiKey: null, authToken: process.env.SLUICE_API_KEY });
  const viaBearer = await bearer.messages.create({ model: "m", max_tokens: 2, messages: [{ role: "user", content: "Hi" }] });
  check("API key as Authorization: Bearer", viaBearer.type === "message", JSON.stringify(viaBearer));
  try {
    await new Anthropic({ ...opts, apiKey: "wrong" }).messages.create({ model: "m", max_tokens: 2, messages: [{ role: "user", content: "Hi" }] });
    bad("a wrong key is refused", "no error");
  } catch (e) {
    check("a wrong key: AuthenticationError (401, authentication_error)",
      e instanceof Anthropic.AuthenticationError && e.error?.error?.type === "authentication_error", String(e));
  }
}

try {
  if (mode === "api") {
    await api();
    await toolUse();
  }
  else if (mode === "key") await key();
  else throw new Error(`unknown mode ${mode}`);
} catch (e) {
  bad(mode, e.stack || String(e));
}
process.exit(failed ? 1 : 0);
