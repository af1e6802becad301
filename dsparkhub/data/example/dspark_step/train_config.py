# DeepSpec-style training config of the dsparkhub embedded example (dspark).
# Written by dsparkhub 0.1.0; a record only, nothing loads it.
model = {
    "block_size": 7,
    "confidence_head_with_markov": True,
    "enable_confidence_head": True,
    "markov_head_type": "vanilla",
    "markov_rank": 32,
    "mask_token_id": 2,
    "num_anchors": 16,
    "num_hidden_layers": 2,
    "target_layer_ids": [
        0,
        1,
        2
    ]
}
train = {
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "target_layer_ids": [
        0,
        1,
        2
    ],
    "block_size": 7,
    "markov_rank": 32,
    "num_anchors": 16,
    "batch_size": 12,
    "steps": 320,
    "lr": 0.003,
    "warmup": 15,
    "loss_decay_gamma": 4.0,
    "ce_loss_alpha": 0.1,
    "l1_loss_alpha": 0.9,
    "confidence_head_alpha": 1.0
}
