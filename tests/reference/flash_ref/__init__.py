"""flash_ref - independent plain-numpy reference of the DeepSeek-V4.1-Flash oracle forward.

Written only from /work/shared/docs/MODEL.md (sections 2-6, 9, 12). Modules:
  safetensors_io  sharded safetensors read/write, raw-byte decoding of BF16/FP8/E8M0/FP4
  config          config.json (nested text_config, fallbacks, aliases) and derived roles
  numerics        BF16 RNE, E4M3/E2M1/UE8M0 codecs, ceil2, the quantizers of section 4
  rope            RoPE frequency / cos-sin tables (YaRN, [tandem] FP32 table rule)
  engram          Engram primes, offsets, multipliers, token map, hashing (section 5.6, 9.2)
  weights         checkpoint tensor access with dequantization (section 3, 12.2)
  model           the section-5 oracle forward, layer by layer (schedule 6(a))
  dumps           the section 12.10 dump formats (TDLOGIT1 logits, --dump-layers directory)
"""
