// Drives a UI message stream endpoint with the AI SDK's own chat code (the `ai` package:
// AbstractChat, the base of useChat, over DefaultChatTransport).
// argv: the endpoint URL and a JSON plan {chatId, prompt, decide, followUp}; a call waiting for
// approval is answered with addToolApprovalResponse, and the chat sends again by itself
// (lastAssistantMessageIsCompleteWithApprovalResponses). Prints one JSON object: the
// chat's messages, status and error, each response's stream header, the finish calls.
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const prefix = process.env.AGENTLOOP_TEST_NPM_PREFIX;
const need = async (name) =>
  import(pathToFileURL(createRequire(`${prefix}/node_modules/`).resolve(name)).href);
const { AbstractChat, DefaultChatTransport, lastAssistantMessageIsCompleteWithApprovalResponses } =
  await need("ai");

class State {
  status = "ready";
  error = undefined;
  messages = [];
  pushMessage = (message) => { this.messages = this.messages.concat(message); };
  popMessage = () => { this.messages = this.messages.slice(0, -1); };
  replaceMessage = (index, message) => {
    this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
  };
  snapshot = (thing) => structuredClone(thing);
}

class Chat extends AbstractChat {
  constructor(options) {
    const state = new State();
    super({ ...options, state });
    this.chatState = state;
  }
}

const [url, planJson] = process.argv.slice(2);
const plan = JSON.parse(planJson);
const headers = [];
const finishes = [];
const recordingFetch = async (input, init) => {
  const response = await fetch(input, init);
  headers.push(response.headers.get("x-vercel-ai-ui-message-stream"));
  return response;
};
const chat = new Chat({
  id: plan.chatId,
  transport: new DefaultChatTransport({ api: url, fetch: recordingFetch }),
  sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
  onFinish: ({ message, finishReason, isError }) => {
    finishes.push({ metadata: message.metadata ?? null, finishReason: finishReason ?? null, isError });
  },
  onError: () => {},
});

const settled = async () => {
  const deadline = Date.now() + 30000;
  while (chat.status === "submitted" || chat.status === "streaming") {
    if (Date.now() > deadline) throw new Error("the chat never settled");
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
};

await chat.sendMessage({ text: plan.prompt });
await settled();
for (let round = 0; round < 3; round++) {
  const last = chat.messages.at(-1);
  const waiting = (last?.parts ?? []).filter((p) => p.state === "approval-requested");
  if (!waiting.length) break;
  for (const part of waiting) {
    const deny = (plan.decide ?? {})[part.type.replace(/^tool-/, "")] === "deny";
    await chat.addToolApprovalResponse({
      id: part.approval.id,
      approved: !deny,
      ...(deny ? { reason: "not today" } : {}),
    });
  }
  await settled();
}
if (plan.followUp) {
  await chat.sendMessage({ text: plan.followUp });
  await settled();
}
console.log(JSON.stringify({
  messages: chat.messages,
  status: chat.status,
  error: chat.error ? String(chat.error.message ?? chat.error) : null,
  headers,
  finishes,
}));
