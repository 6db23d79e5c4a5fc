// mutate-lib.mjs — seeded mutations of JSON values and of their text, for
// the gateway's mutation test (mutate.mjs sends mutated requests; the fake
// upstream's `mutant-SEED` models answer mutated responses). No
// dependencies; the same seed gives the same mutation, so a failure names
// a seed that reproduces it.

// xorshift32: a generator of floats in [0, 1) from a seed.
export function rng(seed) {
  let s = (seed >>> 0) || 0x9e3779b9;
  return () => {
    s ^= s << 13; s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5; s >>>= 0;
    return s / 4294967296;
  };
}

const pick = (r, a) => a[Math.floor(r() * a.length)];

// Values of every JSON type, and the ones readers trip on.
const ODD = [
  null, true, false, 0, -1, 7.5, 1e308, -1e-308, 12345678901234567890, 2 ** 53 + 1,
  '', 'x', 'é', '\u2028', '\ud83d\ude00', '\u0000', '\\', '"', '{"record_id":7', '{}', '[]', 'null',
  'A'.repeat(3000), [], {}, [null], [[]], { '': null }, [{}], { type: 'function' },
  { role: 'tool' }, { role: 'assistant', tool_calls: null }, { type: 'tool_use' }, { type: 'function_call' },
  { type: 'tool_result', tool_use_id: 5 }, { id: {}, type: 'function', function: { name: 7, arguments: {} } },
];

// Every path to a value of v ([] is v itself).
function paths(v, p = [], out = []) {
  out.push(p);
  if (v && typeof v === 'object') for (const k of Object.keys(v)) paths(v[k], p.concat([Array.isArray(v) ? Number(k) : k]), out);
  return out;
}

function at(v, p) {
  for (const k of p) v = v[k];
  return v;
}

function once(root, r) {
  const ps = paths(root);
  const p = ps[Math.floor(r() * ps.length)];
  if (!p.length) return r() < 0.5 ? root : pick(r, ODD);
  const parent = at(root, p.slice(0, -1));
  const k = p[p.length - 1];
  switch (Math.floor(r() * 6)) {
    case 0: // another type, or an odd value
      parent[k] = structuredClone(pick(r, ODD));
      break;
    case 1: // gone
      if (Array.isArray(parent)) parent.splice(k, 1);
      else delete parent[k];
      break;
    case 2: // twice
      if (Array.isArray(parent)) parent.splice(k, 0, structuredClone(parent[k]));
      else parent[k] = [structuredClone(parent[k]), structuredClone(parent[k])];
      break;
    case 3: { // another node's value here
      const q = pick(r, ps);
      parent[k] = structuredClone(at(root, q));
      break;
    }
    case 4: // a string's text: cut, doubled, or its JSON text
      if (typeof parent[k] === 'string') {
        const s = parent[k];
        parent[k] = pick(r, [s.slice(0, Math.floor(s.length / 2)), s + s, JSON.stringify(s), s.toUpperCase()]);
      } else {
        parent[k] = JSON.stringify(parent[k] ?? null);
      }
      break;
    default: // a member added
      if (parent[k] && typeof parent[k] === 'object' && !Array.isArray(parent[k]))
        parent[k][pick(r, ['role', 'type', 'content', 'tool_calls', 'id', 'index', 'x'])] = structuredClone(pick(r, ODD));
      else parent[k] = structuredClone(pick(r, ODD));
  }
  return root;
}

// v with 1 to max mutations (a copy).
export function mutateValue(v, r, max = 3) {
  let o = structuredClone(v);
  const n = 1 + Math.floor(r() * max);
  for (let i = 0; i < n; i++) o = once(o, r);
  return o;
}

// The text of a JSON value, with its bytes mutated: cut, a byte put in
// or changed (often no longer JSON, or no longer UTF-8).
export function mutateText(s, r) {
  const b = Buffer.from(s);
  const i = Math.floor(r() * (b.length + 1));
  switch (Math.floor(r() * 4)) {
    case 0: return b.subarray(0, i);
    case 1: return Buffer.concat([b.subarray(0, i), Buffer.from([Math.floor(r() * 256)]), b.subarray(i)]);
    case 2: if (i < b.length) b[i] = Math.floor(r() * 256); return b;
    default: return Buffer.concat([b.subarray(0, i), Buffer.from(pick(r, ['{', '[', '"', '\\u', ',', '}', ']', ':', '\\'])), b.subarray(i)]);
  }
}
