// hooks.mjs — module hooks that let node run k6 scripts unchanged: the k6
// built-in modules resolve to the stand-ins in this directory, .js files load
// as ES modules (k6 scripts are ES modules without a package.json saying so),
// and remote imports are refused (the scripts must run offline).
import { readFile } from 'node:fs/promises';

const shim = {
  k6: 'k6.mjs',
  'k6/http': 'http.mjs',
  'k6/metrics': 'metrics.mjs',
  'k6/execution': 'execution.mjs',
  'k6/crypto': 'crypto.mjs',
  'k6/encoding': 'encoding.mjs',
};

export async function resolve(specifier, context, next) {
  if (Object.hasOwn(shim, specifier)) {
    return { url: new URL(shim[specifier], import.meta.url).href, shortCircuit: true };
  }
  if (specifier === 'k6' || specifier.startsWith('k6/')) {
    throw new Error(`k6 module ${specifier} has no stand-in in loadtest/k6/testdata/k6shim: add one`);
  }
  if (/^https?:/.test(specifier)) {
    throw new Error(`remote import ${specifier}: the scripts must run offline`);
  }
  return next(specifier, context);
}

export async function load(url, context, next) {
  if (url.startsWith('file:') && url.endsWith('.js')) {
    return { format: 'module', source: await readFile(new URL(url), 'utf8'), shortCircuit: true };
  }
  return next(url, context);
}
