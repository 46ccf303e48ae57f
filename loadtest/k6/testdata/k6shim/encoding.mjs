// encoding.mjs — stand-in for k6/encoding: b64encode and b64decode with
// k6's variants (std, rawstd, url, rawurl).
function variant(enc) {
  switch (enc ?? 'std') {
    case 'std': return { alphabet: 'base64', pad: true };
    case 'rawstd': return { alphabet: 'base64', pad: false };
    case 'url': return { alphabet: 'base64url', pad: true };
    case 'rawurl': return { alphabet: 'base64url', pad: false };
  }
  throw new Error(`b64encode: encoding ${enc}: want std, rawstd, url or rawurl`);
}

export function b64encode(input, enc) {
  const v = variant(enc);
  let out = Buffer.from(input).toString(v.alphabet).replace(/=+$/, '');
  if (v.pad) while (out.length % 4 !== 0) out += '=';
  return out;
}

export function b64decode(input, enc, format) {
  const v = variant(enc);
  const buf = Buffer.from(input, v.alphabet);
  return format === 's' ? buf.toString('utf8') : buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.length);
}

export default { b64encode, b64decode };
