// The tiny-qwen3 chat template (models/chat-templates.ts) renders Qwen3's structure exactly: tools
// as JSON lines in the system turn, tool calls as <tool_call> blocks, tool results grouped in one
// user turn of <tool_response> blocks, reasoning of turns after the last query as a think block,
// and enable_thinking=false closing an empty block in the generation prompt.
import { describe, expect, it } from 'vitest';

import { QWEN3_TEMPLATE } from '../models/chat-templates.js';
import { ChatTemplate } from '../src/text/chat-template.js';
import { toolCallFormat } from '../src/text/tool-calls.js';

const template = new ChatTemplate(QWEN3_TEMPLATE);
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];

describe('tiny-qwen3 template', () => {
  it('renders tools, calls, results and reasoning', () => {
    const text = template.render([
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'Weather in Oslo?' },
      { role: 'assistant', content: '', reasoning_content: 'need tool', tool_calls: [
        { id: 'c1', type: 'function', function: { name: 'get_weather', arguments: { city: 'Oslo' } } },
        { id: 'c2', type: 'function', function: { name: 'get_weather', arguments: { city: 'Bergen' } } }] },
      { role: 'tool', content: '{"temp": 3}', tool_call_id: 'c1' },
      { role: 'tool', content: '{"temp": 5}', tool_call_id: 'c2' },
    ], { tools, enableThinking: false });
    expect(text).toBe(
      '<|im_start|>system\nBe brief.\n\n# Tools\n\nThese functions can be called. Their signatures, one JSON object per line:\n<tools>\n' +
      '{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}\n' +
      '</tools>\n\nTo call functions, answer with one block per call:\n<tool_call>\n{"name": <function name>, "arguments": <arguments as a JSON object>}\n</tool_call><|im_end|>\n' +
      '<|im_start|>user\nWeather in Oslo?<|im_end|>\n' +
      '<|im_start|>assistant\n<think>\nneed tool\n</think>\n\n' +
      '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n' +
      '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Bergen"}}\n</tool_call><|im_end|>\n' +
      '<|im_start|>user\n<tool_response>\n{"temp": 3}\n</tool_response>\n<tool_response>\n{"temp": 5}\n</tool_response><|im_end|>\n' +
      '<|im_start|>assistant\n<think>\n\n</think>\n\n');
  });

  it('drops reasoning of turns before the last query; thinking left on opens nothing itself', () => {
    const text = template.render([
      { role: 'user', content: 'a' }, { role: 'assistant', content: 'b', reasoning_content: 'old' }, { role: 'user', content: 'c' },
    ], { enableThinking: true });
    expect(text).toBe('<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n');
    expect(toolCallFormat(QWEN3_TEMPLATE)).toBe('hermes');
  });
});
