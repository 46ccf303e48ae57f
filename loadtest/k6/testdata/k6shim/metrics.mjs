// metrics.mjs — stand-in for k6/metrics: Counter, Gauge, Rate, Trend, which,
// as in k6, must be made in the init context with a valid name.
import { state, declare, sample, BUILTIN } from './state.mjs';

const NAME = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;

class Metric {
  constructor(name, type, isTime) {
    if (state.phase !== 'init') throw new Error(`metric ${name}: metrics must be made in the init context`);
    if (!NAME.test(name)) throw new Error(`metric name ${name}: want [A-Za-z_][A-Za-z0-9_]*, at most 128`);
    if (Object.hasOwn(BUILTIN, name)) throw new Error(`metric name ${name} is one of k6's own`);
    const m = declare(name, type, isTime);
    if (m.type !== type) throw new Error(`metric ${name} made twice, as ${m.type} and ${type}`);
    this.name = name;
  }

  add(value, tags = {}) {
    if (state.phase === 'init') throw new Error(`${this.name}.add() in the init context`);
    if (typeof value !== 'number' && typeof value !== 'boolean') throw new Error(`${this.name}.add(${value}): not a number`);
    sample(this.name, typeof value === 'boolean' ? (value ? 1 : 0) : value, tags);
  }
}

export class Counter extends Metric { constructor(name) { super(name, 'counter'); } }
export class Gauge extends Metric { constructor(name, isTime = false) { super(name, 'gauge', isTime); } }
export class Rate extends Metric { constructor(name) { super(name, 'rate'); } }
export class Trend extends Metric { constructor(name, isTime = false) { super(name, 'trend', isTime); } }

export default { Counter, Gauge, Rate, Trend };
