"""The metric keys of VIME's log records (the smoke workload prints the same ones), by name.

Readers outside this package (gates, analysis) name a metric through these constants, so a key VIME
renames is one edit here. Example::

    step.value(STEP_TIME)        # the value of 'perf/step_time' in a step's perf record
"""

# rollout records
REWARDS = "rollout/rewards"
RAW_REWARD = "rollout/raw_reward"
RESPONSE_LENGTHS = "rollout/response_lengths"
RESPONSE_LEN_MEAN = "rollout/response_len/mean"
TOTAL_LENGTHS = "rollout/total_lengths"
TRUNCATED = "rollout/truncated"
TRUNCATED_RATIO = "rollout/truncated_ratio"
ROLLOUT_KL = "rollout/kl"
# train (step) records
LOSS = "train/loss"
PG_LOSS = "train/pg_loss"
PG_CLIPFRAC = "train/pg_clipfrac"
ENTROPY_LOSS = "train/entropy_loss"
PPO_KL = "train/ppo_kl"
GRAD_NORM = "train/grad_norm"
GLOBAL_BATCH_SIZE = "train/global_batch_size"
MEAN_ABS_DIFF = "train/train_rollout_logprob_abs_diff"
MAX_ABS_DIFF = "train/train_current_rollout_logprob_max_abs_diff"
MISMATCH_COUNT = "train/train_current_rollout_logprob_mismatch_count"
NUMEL = "train/train_current_rollout_logprob_numel"
# perf records (the rollout side has ROLLOUT_TIME, the train side STEP_TIME)
ROLLOUT_TIME = "perf/rollout_time"
TOKENS_PER_GPU_PER_SEC = "perf/tokens_per_gpu_per_sec"
UPDATE_WEIGHTS_TIME = "perf/update_weights_time"
TRAIN_WAIT_TIME = "perf/train_wait_time"
ACTOR_TRAIN_TIME = "perf/actor_train_time"
TRAIN_TIME = "perf/train_time"
DATA_PREPROCESS_TIME = "perf/data_preprocess_time"
STEP_TIME = "perf/step_time"
ACTOR_TRAIN_TOK_PER_S = "perf/actor_train_tok_per_s"
ACTOR_TRAIN_TFLOPS = "perf/actor_train_tflops"
LOG_PROBS_TIME = "perf/log_probs_time"
REF_LOG_PROBS_TIME = "perf/ref_log_probs_time"

LOG_KEYS = tuple(v for k, v in sorted(globals().items()) if k.isupper() and isinstance(v, str))
