"""Tiny random models and a tiny chat tokenizer, for tests and smoke runs (no download, no network)."""

from __future__ import annotations

import torch

__all__ = ["TINY_WORDS", "tiny_chat_tokenizer", "tiny_llama"]

TINY_WORDS = (
    "user assistant system the a cat dog sat on mat is was and of to in it you i what how why write "
    "tell me about story poem code sum number one two three four five yes no hello world please short "
    "long good bad red blue green big small run jump . , ? !"
).split()

TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_chat_tokenizer():
    """A word-level ``PreTrainedTokenizerFast`` with ``<|im_start|>``/``<|im_end|>`` chat markers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + list(dict.fromkeys(TINY_WORDS)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def tiny_llama(
    vocab_size: int | None = None, num_layers: int = 4, hidden_size: int = 32, seed: int = 0, tokenizer=None
):
    """A random ``LlamaForCausalLM`` (float32, sdpa) whose generation stops at ``<|im_end|>``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer or tiny_chat_tokenizer()
    vocab_size = vocab_size or len(tokenizer)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.set_attn_implementation("sdpa")
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.do_sample = False
    return model
