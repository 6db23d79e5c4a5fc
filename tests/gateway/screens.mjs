// screens.mjs — the screenshots of the gateway tests' computer-use agents
// (agent-responses.mjs, agent-anthropic.mjs): valid PNGs of one pixel.
// SCREEN is the form before any action; screen(n) the same pixel with a
// text chunk saying "page n", a different image for each n. nextScreen()
// is the screen after each action, as $SCREENS says: same (the default:
// the click on Save changed nothing), new (a page turned each time:
// progress), toggle (two screens in turn: a menu opened and closed).
export const SCREEN_B64 = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==';
export const SCREEN = 'data:image/png;base64,' + SCREEN_B64;

const table = Array.from({ length: 256 }, (_, n) => {
  for (let k = 0; k < 8; k++) n = n & 1 ? 0xedb88320 ^ (n >>> 1) : n >>> 1;
  return n >>> 0;
});
const crc32 = (b) => {
  let c = 0xffffffff;
  for (const x of b) c = table[(c ^ x) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
};

// screen n, base64: a tEXt chunk after the header chunk (33 bytes: the
// signature and IHDR), its length and CRC as PNG wants them
export function screenB64(n) {
  const png = Buffer.from(SCREEN_B64, 'base64');
  const body = Buffer.concat([Buffer.from('tEXt'), Buffer.from(`Comment\0page ${n}`)]);
  const len = Buffer.alloc(4), crc = Buffer.alloc(4);
  len.writeUInt32BE(body.length - 4);
  crc.writeUInt32BE(crc32(body));
  return Buffer.concat([png.subarray(0, 33), len, body, crc, png.subarray(33)]).toString('base64');
}

let shots = 0;
export function nextScreenB64() {
  shots++;
  const mode = process.env.SCREENS || 'same';
  return mode === 'new' ? screenB64(shots) : mode === 'toggle' ? screenB64(shots % 2) : SCREEN_B64;
}
