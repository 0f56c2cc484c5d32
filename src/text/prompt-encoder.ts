// Text -> prompt token ids for one model: a plain prompt is tokenized as is, messages are rendered
// with the model's chat template first. The same code runs on the event loop for short inputs and
// in the prompt workers (prompt-pool.ts) for long ones, so both give identical tokens.

import { compileChatTemplate, type ChatMessage, type ChatTemplate, type ChatTool } from './chat-template.js';
import type { SluiceTokenizer } from './tokenizer.js';
import type { ImageTextExpansion } from './image-prompt.js';

/** The text a prompt is made of: exactly one of the two. */
export interface PromptText {
  prompt?: string;
  messages?: readonly ChatMessage[];
  /** With messages: tools for the template, its enable_thinking and reasoning_effort (undefined: its default). */
  tools?: readonly ChatTool[];
  enableThinking?: boolean;
  reasoningEffort?: string;
}

export class PromptEncoder {
  private chatTemplate: ChatTemplate | undefined;

  /** imageText: how the model's processor spells an image in the rendered text (image-prompt.ts). */
  constructor(private readonly tokenizer: SluiceTokenizer, private readonly modelName: string,
    private readonly imageText?: ImageTextExpansion) {}

  encode(req: PromptText): number[] {
    if (req.messages !== undefined) {
      this.chatTemplate ??= compileChatTemplate(this.tokenizer.chatTemplate, this.modelName);
      const text = this.chatTemplate.render(req.messages, {
        bosToken: this.tokenizer.bosToken, eosToken: this.tokenizer.eosToken, addGenerationPrompt: true,
        ...(req.tools !== undefined && req.tools.length > 0 && { tools: req.tools }),
        ...(req.enableThinking !== undefined && { enableThinking: req.enableThinking }),
        ...(req.reasoningEffort !== undefined && { reasoningEffort: req.reasoningEffort }),
      });
      // The template writes bos itself when the model wants it.
      const expanded = this.imageText === undefined ? text : text.split(this.imageText.marker).join(this.imageText.text);
      return this.tokenizer.encode(expanded, { addBos: false });
    }
    return this.tokenizer.encode(req.prompt ?? '');
  }
}

/**
 * UTF-16 code units of the caller's text in a prompt (what a length check can count without
 * rendering or tokenizing). Content parts count their text; anything else counts 0.
 */
export function promptTextLength(req: PromptText): number {
  if (req.messages === undefined) return typeof req.prompt === 'string' ? req.prompt.length : 0;
  // Tools are rendered into the prompt as JSON: their size counts too.
  let n = req.tools === undefined ? 0 : JSON.stringify(req.tools).length;
  for (const m of req.messages) {
    const content = (m as { content?: unknown } | null)?.content;
    if (typeof content === 'string') n += content.length;
    else if (Array.isArray(content)) {
      for (const part of content) {
        const text = (part as { text?: unknown } | null)?.text;
        if (typeof text === 'string') n += text.length;
      }
    }
  }
  return n;
}
