// Loads a model directory's tokenizer (tokenizer.json + tokenizer_config.json) and resolves the
// special tokens the engine needs: bos, eos ids (for stopping) and the chat template source.

import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Tokenizer } from '@huggingface/tokenizers';
import { SluiceError } from '../errors.js';
import { HARMONY_STRUCTURE_TOKENS, isHarmonyTemplate } from './harmony.js';

type JsonObject = Record<string, unknown>;

export interface EncodeOptions {
  /** Prepend the bos token. Default: tokenizer_config.json's add_bos_token (false when absent). */
  addBos?: boolean;
}

export interface DecodeOptions {
  /**
   * Leave special tokens (bos, eos, <|im_start|>...) out of the text, except the chat format's
   * structural ones (structuralTokenIds). Default true.
   */
  skipSpecialTokens?: boolean;
}

/** The subset of SluiceTokenizer that the detokenizer needs (tests may fake it). */
export interface TokenDecoder {
  decode(tokenIds: readonly number[], options?: DecodeOptions): string;
}

export class SluiceTokenizer implements TokenDecoder {
  /** Token ids that end generation: generation_config eos_token_id ∪ the tokenizer's eos_token. */
  readonly eosTokenIds: ReadonlySet<number>;
  /** Ids of tokens marked special in tokenizer.json's added_tokens. */
  readonly specialTokenIds: ReadonlySet<number>;
  /**
   * Special tokens that carry the chat format's message structure, kept in decoded text even when
   * special tokens are skipped, so the output can be read back into its messages: harmony's
   * <|start|>, <|channel|>, <|message|>, <|end|>... for a gpt-oss template; none otherwise. Never an
   * eos token (eos adds no text).
   */
  readonly structuralTokenIds: ReadonlySet<number>;
  readonly bosToken: string | undefined;
  readonly bosTokenId: number | undefined;
  readonly eosToken: string | undefined;
  /** Whether encode() prepends bos by default (tokenizer_config.json add_bos_token). */
  readonly addBosByDefault: boolean;
  /** Jinja source of the chat template, when the model ships one. */
  readonly chatTemplate: string | undefined;

  private readonly inner: Tokenizer;
  private readonly cleanUpTokenizationSpaces: boolean;

  private constructor(fields: {
    inner: Tokenizer;
    tokenizerConfig: JsonObject;
    specialTokenIds: Set<number>;
    eosTokenIds: Set<number>;
    chatTemplate: string | undefined;
  }) {
    const { inner, tokenizerConfig } = fields;
    this.inner = inner;
    this.specialTokenIds = fields.specialTokenIds;
    const structure = isHarmonyTemplate(fields.chatTemplate) ? HARMONY_STRUCTURE_TOKENS : [];
    this.structuralTokenIds = new Set(structure.map((t) => inner.token_to_id(t))
      .filter((id): id is number => id !== undefined && !fields.eosTokenIds.has(id)));
    this.eosTokenIds = fields.eosTokenIds;
    this.chatTemplate = fields.chatTemplate;
    this.bosToken = specialTokenContent(tokenizerConfig['bos_token']);
    this.bosTokenId = this.bosToken === undefined ? undefined : inner.token_to_id(this.bosToken);
    this.eosToken = specialTokenContent(tokenizerConfig['eos_token']);
    this.addBosByDefault = tokenizerConfig['add_bos_token'] === true && this.bosTokenId !== undefined;
    // NOTE: the library defaults this to true, which rewrites " ." etc. and makes incremental
    // decoding disagree with whole-text decoding; we follow the config and default to false.
    this.cleanUpTokenizationSpaces = tokenizerConfig['clean_up_tokenization_spaces'] === true;
  }

  /**
   * Reads `modelDir`/tokenizer.json (required), tokenizer_config.json, generation_config.json
   * and chat_template.jinja (optional). Throws SluiceError model_file_missing / model_file_invalid
   * naming the file.
   */
  static async load(modelDir: string): Promise<SluiceTokenizer> {
    const tokenizerJson = await readJsonFile(modelDir, 'tokenizer.json', { required: true });
    const tokenizerConfig = (await readJsonFile(modelDir, 'tokenizer_config.json', { required: false })) ?? {};
    const generationConfig = await readJsonFile(modelDir, 'generation_config.json', { required: false });

    let inner: Tokenizer;
    try {
      inner = new Tokenizer(tokenizerJson!, tokenizerConfig);
    } catch (err) {
      throw new SluiceError('model_file_invalid',
        `${join(modelDir, 'tokenizer.json')}: cannot build a tokenizer from it: ${(err as Error).message}`,
        { cause: err });
    }

    const specialTokenIds = new Set<number>();
    for (const [id, token] of inner.get_added_tokens_decoder()) {
      if (token.special) specialTokenIds.add(id);
    }

    // eos ids: generation_config.json eos_token_id (number or list) ∪ tokenizer_config eos_token.
    // Without a generation_config.json, config.json's eos_token_id is the fallback (as in HF).
    const eosTokenIds = new Set<number>();
    const eosSource = generationConfig
      ?? (await readJsonFile(modelDir, 'config.json', { required: false }))
      ?? {};
    for (const id of [eosSource['eos_token_id']].flat()) {
      if (typeof id === 'number' && Number.isInteger(id) && id >= 0) eosTokenIds.add(id);
    }
    const eosToken = specialTokenContent(tokenizerConfig['eos_token']);
    if (eosToken !== undefined) {
      const eosId = inner.token_to_id(eosToken);
      if (eosId !== undefined) eosTokenIds.add(eosId);
    }

    const chatTemplate = pickChatTemplate(tokenizerConfig['chat_template'])
      ?? (await readTextFile(modelDir, 'chat_template.jinja'));

    return new SluiceTokenizer({ inner, tokenizerConfig, specialTokenIds, eosTokenIds, chatTemplate });
  }

  /**
   * Text -> token ids. Special-token text in `text` (e.g. "<|im_start|>") maps to its id.
   * Without `addBos`, the tokenizer's own post-processor decides, as transformers' tokenizer(text)
   * does (Llama 3 prepends <|begin_of_text|>, Qwen adds nothing), plus bos when
   * tokenizer_config.json sets add_bos_token and the post-processor did not already add it.
   */
  encode(text: string, options: EncodeOptions = {}): number[] {
    if (options.addBos === undefined) {
      const ids = this.inner.encode(text, { add_special_tokens: true }).ids;
      if (this.addBosByDefault && ids[0] !== this.bosTokenId) return [this.bosTokenId!, ...ids];
      return ids;
    }
    const ids = this.inner.encode(text, { add_special_tokens: false }).ids;
    if (options.addBos && this.bosTokenId !== undefined) return [this.bosTokenId, ...ids];
    return ids;
  }

  /** Token ids -> text. An incomplete UTF-8 sequence at the end decodes to U+FFFD. */
  decode(tokenIds: readonly number[], options: DecodeOptions = {}): string {
    if (tokenIds.length === 0) return '';
    let ids = tokenIds as number[];
    let skip = options.skipSpecialTokens ?? true;
    if (skip && this.structuralTokenIds.size > 0 && ids.some((id) => this.structuralTokenIds.has(id))) {
      // Skip the other special tokens here and decode the rest with specials shown.
      ids = ids.filter((id) => this.structuralTokenIds.has(id) || !this.specialTokenIds.has(id));
      skip = false;
    }
    return this.inner.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: this.cleanUpTokenizationSpaces });
  }

  /** The text of one token on its own, special tokens included (for logprobs display). */
  tokenText(tokenId: number): string {
    return this.decode([tokenId], { skipSpecialTokens: false });
  }

  isSpecial(tokenId: number): boolean {
    return this.specialTokenIds.has(tokenId);
  }

  /**
   * An upper bound on the UTF-8 bytes of text one token can stand for: the longest vocabulary
   * entry in UTF-8 (a byte-level entry spends at least one byte per byte it stands for; a
   * sentencepiece entry's "▁" and "<0xNN>" spend more). So a text longer than
   * contextLength × maxTokenBytes code units can never fit in contextLength tokens.
   */
  get maxTokenBytes(): number {
    if (this.maxTokenBytesCache === undefined) {
      let max = 1;
      for (const token of this.inner.get_vocab(true).keys()) max = Math.max(max, Buffer.byteLength(token, 'utf8'));
      this.maxTokenBytesCache = max;
    }
    return this.maxTokenBytesCache;
  }
  private maxTokenBytesCache: number | undefined;

  /** Every token string and its id, added tokens included (as tokenizer.json stores them). */
  vocab(): Map<string, number> {
    return this.inner.get_vocab(true);
  }

  /** Id of a token string, or undefined when it is not in the vocabulary. */
  tokenId(token: string): number | undefined {
    return this.inner.token_to_id(token);
  }
}

/** tokenizer_config.json writes special tokens as a string or as {content: string, ...}. */
function specialTokenContent(value: unknown): string | undefined {
  if (typeof value === 'string') return value;
  if (value !== null && typeof value === 'object' && typeof (value as JsonObject)['content'] === 'string') {
    return (value as JsonObject)['content'] as string;
  }
  return undefined;
}

/** chat_template is a string, or a list of {name, template} where 'default' is the chat one. */
function pickChatTemplate(value: unknown): string | undefined {
  if (typeof value === 'string') return value;
  if (Array.isArray(value)) {
    const named = value.filter((t): t is { name: string; template: string } =>
      t !== null && typeof t === 'object' && typeof t.template === 'string');
    return (named.find((t) => t.name === 'default') ?? named[0])?.template;
  }
  return undefined;
}

async function readTextFile(modelDir: string, fileName: string): Promise<string | undefined> {
  try {
    return await readFile(join(modelDir, fileName), 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new SluiceError('model_file_invalid', `${join(modelDir, fileName)}: cannot read: ${(err as Error).message}`,
      { cause: err });
  }
}

/** Reads and parses a JSON object file. Missing + required -> model_file_missing; bad JSON -> model_file_invalid. */
export async function readJsonFile(
  modelDir: string, fileName: string, options: { required: boolean },
): Promise<JsonObject | undefined> {
  const path = join(modelDir, fileName);
  const text = await readTextFile(modelDir, fileName);
  if (text === undefined) {
    if (!options.required) return undefined;
    throw new SluiceError('model_file_missing', `${path} does not exist (is ${modelDir} a Hugging Face model directory?)`);
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw new SluiceError('model_file_invalid', `${path} is not valid JSON: ${(err as Error).message}`, { cause: err });
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    throw new SluiceError('model_file_invalid', `${path} must hold a JSON object`);
  }
  return parsed as JsonObject;
}
