import os
from deepspec.trainer import Qwen3DSparkTrainer
project_name = "deepspec"
exp_name = "dspark_tiny"
seed = 42

model = dict(
    target_model_name_or_path="/tmp/dsparkhub-deepspec-gen-o5keq5tt/target",
    block_size=4,
    num_draft_layers=1,
    target_layer_ids=[0, 2],
    mask_token_id=127,
    num_anchors=8,
    markov_rank=8,
    markov_head_type='vanilla',
    confidence_head_alpha=1.0,
    confidence_head_with_markov=True,
    loss_decay_gamma=4.0,
    ce_loss_alpha=0.1,
    l1_loss_alpha=0.9,
)

train = dict(
    trainer_cls=Qwen3DSparkTrainer,
    lr=6.0e-4,
    warmup_ratio=0.04,
    weight_decay=0.0,
    precision="bf16",
    local_batch_size=1,
    global_batch_size=1,
    num_train_epochs=1,
    max_train_steps=2,
    max_grad_norm=1.0,
    sharding_strategy="no_shard",
    torch_compile=False,
)

logging = dict(
    logging_steps=1,
    checkpointing_steps=2,
    checkpoint_dir="/tmp/dsparkhub-deepspec-fixture/checkpoints/deepspec/dspark_tiny",
    tensorboard_dir=None,
)

data = dict(target_cache_path=None, chat_template="qwen", max_length=64, num_workers=0)
