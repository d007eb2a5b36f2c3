"""The trainer: a run built from its config, and the loop that trains it (sync and async PPO alike).

`asyncppo train` and `asyncppo bench train` (cli/; the bench's named workloads: train_bench.py), the scripts
and the integration tests all train through this package:

    setup = resolve_setup(config, config_dir, data=True)   # trainer/setup.py: every command starts here
    run = start_run(setup, run_dir)                        # trainer/build.py (build_run = both lines)
    try:
        train(run)                                         # trainer/loop.py
    finally:
        run.close()

Lifecycle of a run (module in brackets):

  setup, before any process  config rules, the pre-flight (sinks, reward function, training and validation rows),
                             the rollout kind; then device, model directories (tiny: and demo: models built
                             into the cache), tokenizer, end and pad ids, engine settings [setup, preflight]
  build, before any process  the checkpoint to resume: the newest that verifies (manifest, run state against the
                             books) or `--resume-from`'s, hashed once; its config checked against the run's
                             [resume, run_checkpoints]; devices fitted [placement]; right before Ray:
                             `config.yaml` (a fresh start) or `config_history/` (a changed resume), a note per
                             checkpoint passed over, later ones set aside after `--resume-from` [resume]
  build                      Ray (local, loopback) -> policy workers (+ the colocated engine) -> value
                             workers (none for raw_reward) -> generator workers and their weight-sync group
                             (non-colocated) [worker_start] -> rollout functions: gym servers and client, or the
                             reward function [run_inputs, gym_setup]
  build                      the resume's checkpoint manager and step; the batch source (sync, or async
                             with its collector) positioned there; metric sinks, metrics.jsonl cut back to
                             that step; the schedule [build, run_checkpoints, run_metrics, schedule]
  start                      restore the resume's checkpoint (weights, optimizers, batch source, RNG),
                             or warm-start the critic on a fresh run; publish the policy as version = step;
                             validate at step 0 (`ppo.val_at_start`) [run_checkpoints, generation_side, loop]
  each step                  reseed generation (sync) -> next batch from the source -> privileged-critic
                             prefixes -> PPO step (values, logprobs, reference logprobs, advantages, critic
                             then policy updates) -> weight update inside the source's weight-update context
                             (async: rollouts drained or paused) -> validation, plots, rollout dumps on
                             schedule -> metrics -> the books every `log_every` -> checkpoint on schedule
                             [loop, ppo_step, validation, step_records]
  checkpoint step_N/         `policy/` (once it has trained) and `value/`: weights, optimizer, scheduler; the
                             batch source state (data position; async: buffer and collector); `accounting.json`
                             (where every prompt drawn is: trained, dropped by reason, buffered, pending); RNG
                             state; run state (step, epoch, prompts consumed, the critic's warm-start source);
                             `config.yaml` [run_checkpoints]
  end                        close the batch source, the sinks and the gym servers, then end every worker
                             process [run]
  stop (SIGTERM / SIGINT)    while the run starts: what started ends at once; once it trains: the step in
                             progress ends and is checkpointed (a second signal abandons it); then the run
                             closes, Ray shuts down, one line, exit 143 / 130 [stop_signals, stopping, loop]
"""
