// crypto.mjs — stand-in for k6/crypto: hmac, as k6 computes it (node's
// crypto underneath), with k6's output encodings.
import { createHmac } from 'node:crypto';

const ENCODINGS = { hex: 'hex', base64: 'base64', base64url: 'base64url', base64rawurl: 'base64url' };

export function hmac(algorithm, secret, data, outputEncoding) {
  if (algorithm !== 'sha256') throw new Error(`k6shim crypto.hmac: only sha256 is stood in for, not ${algorithm}`);
  const enc = ENCODINGS[outputEncoding];
  if (enc === undefined) throw new Error(`crypto.hmac: output encoding ${outputEncoding}: want hex, base64, base64url or base64rawurl`);
  let out = createHmac('sha256', secret).update(data).digest(enc);
  // k6's base64url is padded; node's never is.
  if (outputEncoding === 'base64url') while (out.length % 4 !== 0) out += '=';
  return out;
}

export default { hmac };
