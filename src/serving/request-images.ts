// A request's images, from its parts to what the engine takes: fetched (URLs under the address
// policy, concurrently, within one deadline each) or read from data URIs, decoded, and prepared by
// the model's own preprocessor. The limits bound what one request may make the service hold: the
// number of images, and the pixels they are resized to (the encoder's input, 12 bytes a pixel).

import { SluiceError } from '../errors.js';
import type { ResolveAll } from '../webhooks/callback-sender.js';
import { decodeImage } from '../vision/image-decode.js';
import { DEFAULT_IMAGE_LIMITS, loadImageBytes, type ImageBytes, type ImageLimits } from '../vision/image-source.js';
import { sharedPreparationSlots } from '../vision/preparation-slots.js';
import type { PreparedImage, VisionModel } from '../vision/vision-model.js';
import type { RequestImage } from './generation-request.js';

export interface ImageInputSettings {
  /** Lets image URLs reach private, loopback and link-local addresses (a trusted network); default false. */
  allowPrivateAddresses?: boolean;
  /** Per image: encoded bytes, decoded pixels, fetch time and redirects (vision/image-source.ts). */
  limits?: Partial<ImageLimits>;
  /** Images one request may hold (default 16). */
  maxImagesPerRequest?: number;
  /** Pixels a request's images may be resized to in all (default 16 Mi: about 21k tokens at patch 14, merge 2). */
  maxResizedPixelsPerRequest?: number;
  /** DNS resolution of image URL hosts (tests substitute answers). */
  resolveAll?: ResolveAll;
}

export const DEFAULT_IMAGE_INPUT: Required<Omit<ImageInputSettings, 'resolveAll' | 'limits'>> = {
  allowPrivateAddresses: false,
  maxImagesPerRequest: 16,
  maxResizedPixelsPerRequest: 16 * 1024 * 1024,
};

/**
 * The request's images prepared for `vision`, in order. Fetches run concurrently; decoding and
 * preprocessing one image at a time, so a request holds at most one decoded image beside the
 * prepared ones. Errors are SluiceError invalid_request naming the part (or `cancelled`).
 */
export async function prepareRequestImages(vision: VisionModel, images: readonly RequestImage[],
  settings: ImageInputSettings = {}, signal?: AbortSignal): Promise<PreparedImage[]> {
  const maxImages = settings.maxImagesPerRequest ?? DEFAULT_IMAGE_INPUT.maxImagesPerRequest;
  if (images.length > maxImages) {
    throw new SluiceError('invalid_request', `a request may hold at most ${maxImages} images, this one holds ${images.length}`,
      { param: images[maxImages]!.param });
  }
  const limits = { ...DEFAULT_IMAGE_LIMITS, ...settings.limits };
  const fetched = images.map((image) => loadImageBytes(image.url, {
    param: image.param, allowPrivateAddresses: settings.allowPrivateAddresses ?? DEFAULT_IMAGE_INPUT.allowPrivateAddresses,
    limits, ...(signal && { signal }), ...(settings.resolveAll && { resolveAll: settings.resolveAll }),
  }));
  // Every fetch is awaited (settled) before this returns, so none outlives a failed request.
  const settled = await Promise.allSettled(fetched);
  const failed = settled.find((s): s is PromiseRejectedResult => s.status === 'rejected');
  if (failed) throw failed.reason;
  const budget = settings.maxResizedPixelsPerRequest ?? DEFAULT_IMAGE_INPUT.maxResizedPixelsPerRequest;
  let pixels = 0;
  const out: PreparedImage[] = [];
  for (const [k, image] of images.entries()) {
    const bytes = (settled[k] as PromiseFulfilledResult<ImageBytes>).value;
    // Decode and resize within the process's preparation slots (preparation-slots.ts).
    out.push(await sharedPreparationSlots().run(async () => {
      const decoded = await decodeImage(bytes, limits, image.param);
      try {
        pixels += vision.tokensFor(decoded.width, decoded.height, image.detail).pixels;
      } catch (err) {
        throw new SluiceError('invalid_request', `${image.param}: ${(err as Error).message}`, { param: image.param, cause: err });
      }
      if (pixels > budget) {
        throw new SluiceError('invalid_request',
          `the request's images need more than ${budget} pixels after resizing (the limit per request): send fewer or smaller images, or detail "low"`,
          { param: image.param });
      }
      if (signal?.aborted) throw new SluiceError('cancelled', 'the request was cancelled');
      return vision.prepare(decoded, image.detail);
    }, signal));
  }
  return out;
}
