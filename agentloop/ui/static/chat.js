// The chat page: sends the conversation to the AG-UI endpoint (/agui) and shows the run
// as its events arrive: streamed text, a card per tool call (input, live status and
// duration, result), approve/deny buttons for calls that wait, tokens and cost.
"use strict";

const ENDPOINT = "agui";
const threadId = newId("thread");
const messages = []; // the conversation, as AG-UI messages: sent with every request
const cards = new Map(); // tool call id -> its card
const bubbles = new Map(); // text or reasoning message id -> its element
let interrupts = []; // the calls the last run left waiting for a decision
const decisions = new Map();

const $ = (id) => document.getElementById(id);
const log = $("log");

function newId(kind) {
  const random = Array.from(crypto.getRandomValues(new Uint8Array(9)), (b) => b.toString(16));
  return `${kind}-${random.join("")}`;
}

function setStatus(status) {
  $("status").dataset.status = status;
  $("status").textContent = status;
  $("send").disabled = status === "running";
}

function showError(text) {
  $("error").hidden = !text;
  $("error").textContent = text || "";
}

function scrollDown() {
  log.scrollTop = log.scrollHeight;
}

function bubble(kind, text) {
  const element = document.createElement("div");
  element.className = `message ${kind}`;
  element.textContent = text;
  log.append(element);
  scrollDown();
  return element;
}

function assistantMessage(id) {
  let message = messages.find((m) => m.id === id);
  if (!message) {
    message = { id, role: "assistant", content: "", toolCalls: [] };
    messages.push(message);
  }
  return message;
}

function callRow(messageId) {
  const key = `calls-${messageId}`;
  let row = document.getElementById(key);
  if (!row) {
    row = document.createElement("div");
    row.className = "calls";
    row.id = key;
    log.append(row);
  }
  return row;
}

function pretty(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

// -- tool call cards

function newCard(id, name, messageId) {
  const element = document.createElement("div");
  element.className = "card";
  element.dataset.callId = id;
  element.dataset.tool = name;
  element.innerHTML =
    '<div class="top"><span class="name"></span><span class="state"></span></div>' +
    '<pre class="input"></pre><div class="reason" hidden></div>' +
    '<div class="buttons" hidden><button class="approve" type="button">Approve</button>' +
    '<button class="deny" type="button">Deny</button></div><pre class="result" hidden></pre>';
  element.querySelector(".name").textContent = name;
  element.querySelector(".approve").onclick = () => decide(id, true);
  element.querySelector(".deny").onclick = () => decide(id, false);
  callRow(messageId).append(element);
  const card = { element, args: "", started: null, seconds: null, timer: null };
  cards.set(id, card);
  setCard(card, "input");
  scrollDown();
  return card;
}

const LABELS = {
  input: "writing input…", running: "running", done: "done", error: "failed",
  waiting: "waiting for approval", approved: "approved", denied: "denied",
};

function setCard(card, status) {
  card.element.dataset.status = status;
  if (status !== "running" && card.timer) {
    clearInterval(card.timer);
    card.timer = null;
  }
  if (status === "running" && !card.timer) {
    card.started = performance.now();
    card.timer = setInterval(() => paintCard(card), 100);
  }
  paintCard(card);
}

function paintCard(card) {
  const status = card.element.dataset.status;
  let label = LABELS[status] || status;
  const seconds = card.seconds ?? (card.started ? (performance.now() - card.started) / 1000 : null);
  if (card.element.dataset.approved === "true") label = `approved · ${label}`;
  if (seconds !== null && status !== "waiting") label += ` · ${seconds.toFixed(2)} s`;
  card.element.querySelector(".state").textContent = label;
}

function waitFor(id, reason) {
  const card = cards.get(id);
  if (!card || card.element.dataset.status === "waiting") return;
  setCard(card, "waiting");
  const why = card.element.querySelector(".reason");
  why.hidden = !reason;
  why.textContent = reason || "";
  card.element.querySelector(".buttons").hidden = false;
}

function decide(id, approved) {
  decisions.set(id, approved);
  const card = cards.get(id);
  card.element.querySelector(".buttons").hidden = true;
  setCard(card, approved ? "approved" : "denied");
  if (interrupts.every((i) => decisions.has(i.id))) {
    const resume = interrupts.map((i) => ({
      interruptId: i.id,
      status: "resolved",
      payload: { approved: decisions.get(i.id) },
    }));
    interrupts = [];
    decisions.clear();
    run({ resume });
  }
}

// -- the run's events

function showUsage(usage, cost) {
  if (usage) $("tokens").textContent = String(usage.inputTokens + usage.outputTokens);
  $("cost").textContent = typeof cost === "number" ? `$${cost.toFixed(6)}` : "–";
}

function handle(event) {
  switch (event.type) {
    case "TEXT_MESSAGE_START":
      bubbles.set(event.messageId, bubble("assistant", ""));
      assistantMessage(event.messageId);
      break;
    case "TEXT_MESSAGE_CONTENT":
      bubbles.get(event.messageId).textContent += event.delta;
      assistantMessage(event.messageId).content += event.delta;
      scrollDown();
      break;
    case "REASONING_MESSAGE_START":
      bubbles.set(event.messageId, bubble("thinking", ""));
      break;
    case "REASONING_MESSAGE_CONTENT":
      bubbles.get(event.messageId).textContent += event.delta;
      break;
    case "TOOL_CALL_START": {
      const parent = event.parentMessageId || event.toolCallId;
      newCard(event.toolCallId, event.toolCallName, parent);
      assistantMessage(parent).toolCalls.push({
        id: event.toolCallId,
        type: "function",
        function: { name: event.toolCallName, arguments: "" },
      });
      break;
    }
    case "TOOL_CALL_ARGS": {
      const card = cards.get(event.toolCallId);
      card.args += event.delta;
      card.element.querySelector(".input").textContent = pretty(card.args);
      const call = messages.flatMap((m) => m.toolCalls || []).find((c) => c.id === event.toolCallId);
      call.function.arguments += event.delta;
      break;
    }
    case "TOOL_CALL_END":
      setCard(cards.get(event.toolCallId), "running");
      break;
    case "TOOL_CALL_RESULT": {
      messages.push({
        id: event.messageId, role: "tool", toolCallId: event.toolCallId, content: event.content,
      });
      const card = cards.get(event.toolCallId);
      if (!card) break;
      const meta = event.metadata || {};
      card.seconds = meta.durationSeconds ?? null;
      card.element.dataset.approved = String(meta.approved === true);
      const result = card.element.querySelector(".result");
      result.hidden = false;
      result.textContent = pretty(String(event.content));
      setCard(card, meta.approved === false ? "denied" : meta.isError ? "error" : "done");
      break;
    }
    case "CUSTOM":
      if (event.name === "agentloop.approval_requested") {
        waitFor(event.value.toolCallId, event.value.reason);
      }
      break;
    case "STATE_SNAPSHOT":
      showUsage(event.snapshot.usage, event.snapshot.costUsd);
      break;
    case "RUN_FINISHED": {
      showUsage(null, event.metadata ? event.metadata.costUsd : null);
      const outcome = event.outcome || { type: "success" };
      if (outcome.type === "interrupt") {
        interrupts = outcome.interrupts;
        for (const i of interrupts) waitFor(i.toolCallId || i.id, i.message);
      }
      return outcome.type === "interrupt" ? "waiting" : "idle";
    }
    case "RUN_ERROR":
      showError(event.message);
      return "idle";
  }
  return null;
}

async function run(extra) {
  setStatus("running");
  showError("");
  let ended = null;
  try {
    const response = await fetch(ENDPOINT, {
      method: "POST",
      headers: { "content-type": "application/json", accept: "text/event-stream" },
      body: JSON.stringify({
        threadId, runId: newId("run"), messages, tools: [], context: [], state: {},
        forwardedProps: {}, ...extra,
      }),
    });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      const frames = buffer.split("\n\n");
      buffer = frames.pop();
      for (const frame of frames) {
        const data = frame.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6));
        if (data.length) ended = handle(JSON.parse(data.join("\n"))) || ended;
      }
    }
  } catch (error) {
    showError(`The run could not be read: ${error.message}`);
  }
  setStatus(ended || "idle");
}

$("ask").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || $("status").dataset.status === "running") return;
  $("prompt").value = "";
  for (const i of interrupts) {
    // a new message instead of a decision: the server answers the waiting calls as
    // never decided, and the conversation goes on
    const card = cards.get(i.toolCallId || i.id);
    card.element.querySelector(".buttons").hidden = true;
    setCard(card, "denied");
  }
  interrupts = [];
  decisions.clear();
  messages.push({ id: newId("user"), role: "user", content: text });
  bubble("user", text);
  run({});
});

$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("ask").requestSubmit();
  }
});
