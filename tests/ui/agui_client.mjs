// Drives an AG-UI endpoint with the protocol's own client (@ag-ui/client's HttpAgent).
// argv: the endpoint URL and a JSON plan {threadId, prompt, tools, decide, results};
// prints one JSON object: each run's events (as the client verified and parsed them),
// the interrupts it answered, and the client's messages and state at the end.
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const prefix = process.env.AGENTLOOP_TEST_NPM_PREFIX;
const need = async (name) =>
  import(pathToFileURL(createRequire(`${prefix}/node_modules/`).resolve(name)).href);
const { HttpAgent } = await need("@ag-ui/client");

const [url, planJson] = process.argv.slice(2);
const plan = JSON.parse(planJson);
const agent = new HttpAgent({ url, threadId: plan.threadId });
agent.addMessage({ id: "user-1", role: "user", content: plan.prompt });

const runs = [];
let resume;
for (let i = 0; i < (plan.maxRuns ?? 4); i++) {
  const events = [];
  let failed = null;
  try {
    await agent.runAgent(
      { tools: plan.tools ?? [], ...(resume ? { resume } : {}) },
      { onEvent: ({ event }) => { events.push(event); } },
    );
  } catch (error) {
    failed = String(error?.message ?? error);
  }
  runs.push({ events, failed });
  const finished = events.find((e) => e.type === "RUN_FINISHED");
  const outcome = finished?.outcome;
  resume = undefined;
  if (outcome?.type === "interrupt") {
    resume = outcome.interrupts.map((interrupt) => ({
      interruptId: interrupt.id,
      status: "resolved",
      payload: { approved: (plan.decide ?? {})[interrupt.metadata?.toolName] !== "deny" },
    }));
    continue;
  }
  const pending = outcome?.pendingToolCallIds ?? [];
  if (pending.length) {
    for (const id of pending) {
      const call = agent.messages.flatMap((m) => m.toolCalls ?? []).find((c) => c.id === id);
      agent.addMessage({
        id: `result-${id}`,
        role: "tool",
        toolCallId: id,
        content: String((plan.results ?? {})[call.function.name]),
      });
    }
    continue;
  }
  break;
}
console.log(JSON.stringify({ runs, messages: agent.messages, state: agent.state }));
