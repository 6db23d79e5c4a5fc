// codex-shell.mjs — Codex's own shell tool, as the gateway tests' agents
// (agent-responses.mjs, agent-openai.mjs with CODEX=1) offer and answer
// it: a function tool named `shell` whose arguments are the command as an
// argv array, answered with JSON text `{"output": ..., "metadata":
// {"exit_code": N, "duration_seconds": S}}` (the text the model reads; the
// duration differs every time, as a real command's does). Here every
// command fails: make's error, exit code 2.
export const SHELL_PARAMETERS = {
  type: 'object',
  properties: {
    command: { type: 'array', items: { type: 'string' }, description: 'The command to execute' },
    workdir: { type: 'string', description: 'The working directory to execute the command in' },
    timeout_ms: { type: 'number', description: 'The timeout for the command in milliseconds' },
  },
  required: ['command'],
  additionalProperties: false,
};
export const SHELL_DESCRIPTION = 'Runs a shell command and returns its output.';

export function shellOutput(n) {
  return JSON.stringify({ output: 'make: *** [Makefile:12: test] Error 2\n', metadata: { exit_code: 2, duration_seconds: 0.4 + n / 10 } });
}
