// register.mjs — node --import ./register.mjs: maps the k6 modules to this
// shim (see hooks.mjs). Part of loadtest/k6check_test.go; not for k6.
import { register } from 'node:module';

register('./hooks.mjs', import.meta.url);
