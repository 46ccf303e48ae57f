// execution.mjs — stand-in for k6/execution: one VU (id 1) running the
// iterations run.mjs drives. As in k6, scenario and VU information exist only
// in VU code, not in the init context, setup() or teardown().
import { state } from './state.mjs';

function inVU(what) {
  if (state.phase !== 'vu') throw new Error(`k6/execution ${what} used outside VU code (phase ${state.phase})`);
}

export default {
  get scenario() {
    inVU('scenario');
    return {
      name: state.scenario, executor: state.executor, startTime: 0, progress: 0,
      iterationInInstance: state.iteration, iterationInTest: state.iteration,
    };
  },
  get vu() {
    inVU('vu');
    return {
      idInInstance: 1, idInTest: 1, iterationInInstance: state.iteration,
      iterationInScenario: state.iteration, tags: {}, metrics: { tags: {}, metadata: {} },
    };
  },
  get instance() {
    return { iterationsInterrupted: 0, iterationsCompleted: state.iteration, vusActive: 1, vusInitialized: 1, currentTestRunDuration: 0 };
  },
  test: {
    abort(msg) {
      throw new Error(`test aborted: ${msg}`);
    },
    options: {},
  },
};
