// A HotpotQA agent in plain Node.js (20 or newer): no npm packages, only the built-in fetch. sleuth runs it once
// per episode in this directory: the task's JSON on stdin, OPENAI_BASE_URL (the episode's session) and
// OPENAI_API_KEY in the environment; what it prints on stdout is its answer. It asks the model once with a
// `read` tool over the task's documents and, if the model reads, once more for the answer.

const TOOLS = [{
  type: "function",
  function: {
    name: "read",
    description: "The text of the document with this title.",
    parameters: { type: "object", properties: { title: { type: "string" } }, required: ["title"] },
  },
}];

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return Buffer.concat(chunks).toString("utf8");
}

async function chat(body) {
  const response = await fetch(`${process.env.OPENAI_BASE_URL}/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${process.env.OPENAI_API_KEY}` },
    body: JSON.stringify({ model: "policy", ...body }),
  });
  if (!response.ok) throw new Error(`chat/completions answered ${response.status}: ${await response.text()}`);
  return (await response.json()).choices[0].message;
}

function read(docs, args) {
  let title = "";
  try {
    title = String(JSON.parse(args).title ?? "").trim().toLowerCase();
  } catch {
    return "the arguments are not JSON";
  }
  const doc = docs.find((d) => d.title.toLowerCase() === title);
  return doc ? doc.text : `no document is titled ${JSON.stringify(title)}`;
}

async function main() {
  const task = JSON.parse(await readStdin());
  const docs = task.payload.docs;
  const messages = [
    { role: "system", content: "Answer the question from the documents. Read one if you need it. "
                               + "Reply with: Answer: <a few words>" },
    { role: "user", content: `${task.question}\n\nDocuments:\n${docs.map((d) => d.title).join("\n")}` },
  ];
  const first = await chat({ messages, tools: TOOLS });
  if (!first.tool_calls?.length) return first.content ?? "";
  messages.push(first);
  for (const call of first.tool_calls) {
    messages.push({ role: "tool", tool_call_id: call.id, content: read(docs, call.function.arguments) });
  }
  // The same tools again: the prompt then extends the first call's, so sleuth records one chain of calls (with
  // other tools, or tool_choice "none", the rendered prompt changes and the second call starts a new segment).
  const second = await chat({ messages, tools: TOOLS });
  return second.content ?? "";
}

try {
  process.stdout.write(`${await main()}\n`);
} catch (error) {
  console.error(`agent.mjs: ${error.message}`);
  process.exit(1);
}
