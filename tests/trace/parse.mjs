// Loads a trace.json with Chrome DevTools' trace engine (@paulirish/trace_engine, the Performance
// panel's own parser) and prints what it made of it as JSON: the processes and threads it found
// with their names, each thread's slices and instant events as the engine placed them, and the
// counter samples it accepted. tests/trace.rs asserts on this.
//
// Usage: node parse.mjs TRACE_JSON
import fs from 'node:fs';
import * as Trace from '@paulirish/trace_engine';

// The engine needs DOMRect, which Node does not have (its README says to polyfill it).
globalThis.DOMRect ??= class DOMRect {
  constructor(x = 0, y = 0, width = 0, height = 0) { Object.assign(this, {x, y, width, height}); }
};

const file = process.argv[2];
if (!file) {
  console.error('usage: node parse.mjs TRACE_JSON');
  process.exit(2);
}
const json = JSON.parse(fs.readFileSync(file, 'utf8'));
if (!Array.isArray(json.traceEvents)) {
  console.error(`${file}: no traceEvents array`);
  process.exit(1);
}
const model = Trace.TraceModel.Model.createWithAllHandlers();
await model.parse(json.traceEvents);
const parsed = model.parsedTrace();
const {Meta, Renderer} = parsed.data;

const processNames = new Map([...Meta.processNames].map(([pid, e]) => [pid, e.args?.name]));
const threads = [];
for (const [pid, proc] of Renderer.processes) {
  for (const [tid, thread] of proc.threads) {
    const slices = [];
    const instants = [];
    for (const e of thread.entries) {
      if (Trace.Types.Events.isComplete(e)) {
        slices.push({name: e.name, cat: e.cat, ts: e.ts, dur: e.dur, args: e.args ?? {}});
      } else if (Trace.Types.Events.isInstant(e)) {
        instants.push({name: e.name, ts: e.ts, scope: e.s, args: e.args ?? {}});
      }
    }
    threads.push({pid, tid, process: processNames.get(pid) ?? null, name: thread.name ?? null, slices, instants});
  }
}
const counters = parsed.traceEvents
  .filter(e => e.ph === Trace.Types.Events.Phase.COUNTER)
  .map(e => ({pid: e.pid, process: processNames.get(e.pid) ?? null, name: e.name, ts: e.ts, args: e.args}));
const bounds = parsed.data.Meta.traceBounds;
console.log(JSON.stringify({
  processes: [...processNames].map(([pid, name]) => ({pid, name})),
  threads,
  counters,
  bounds: {min: bounds.min, max: bounds.max},
}));
