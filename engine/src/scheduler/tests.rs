//! Scheduler unit tests: chunking, mixing decode and prefill, preemption, the long-request queue.
use super::*;
use crate::sampling::SamplingParams;

fn seq(id: u64, len: usize) -> Sequence {
    Sequence::new(id, (0..len as u32).collect(), SamplingParams::default())
}

#[test]
fn prompt_is_chunked_under_the_budget() {
    let cfg = SchedulerConfig {
        max_batched_tokens: 8,
        max_prefill_chunk: 8,
        max_num_seqs: 4,
        block_size: 4,
        ..Default::default()
    };
    let mut s = Scheduler::new(cfg, 16, PrefixSettings::default()).unwrap();
    s.add(seq(0, 20)).unwrap();
    let mut starts = vec![];
    loop {
        let chunks = s.schedule().unwrap().chunks;
        let c = chunks[0];
        starts.push((c.start, c.len, c.wants_logits));
        s.running[0].num_computed += c.len;
        if c.wants_logits {
            break;
        }
    }
    assert_eq!(starts, vec![(0, 8, false), (8, 8, false), (16, 4, true)]);
    assert_eq!(s.running[0].blocks.len(), 5);
}

#[test]
fn decode_and_prefill_share_a_step() {
    let cfg = SchedulerConfig {
        max_batched_tokens: 6,
        max_prefill_chunk: 6,
        max_num_seqs: 4,
        block_size: 4,
        ..Default::default()
    };
    let mut s = Scheduler::new(cfg, 16, PrefixSettings::default()).unwrap();
    s.add(seq(0, 3)).unwrap();
    let c = s.schedule().unwrap().chunks;
    s.running[0].num_computed += c[0].len;
    s.running[0].tokens.push(9);
    s.add(seq(1, 10)).unwrap();
    let c = s.schedule().unwrap().chunks;
    assert_eq!(c.len(), 2);
    assert_eq!((c[0].start, c[0].len), (3, 1), "decode of seq 0");
    assert_eq!(
        (c[1].start, c[1].len, c[1].wants_logits),
        (0, 5, false),
        "first chunk of seq 1"
    );
}

#[test]
fn out_of_blocks_preempts_newest_and_frees_everything_at_the_end() {
    let cfg = SchedulerConfig {
        max_batched_tokens: 64,
        max_prefill_chunk: 64,
        max_num_seqs: 4,
        block_size: 4,
        ..Default::default()
    };
    let mut s = Scheduler::new(cfg, 3, PrefixSettings::default()).unwrap();
    s.add(seq(0, 4)).unwrap();
    s.add(seq(1, 4)).unwrap();
    s.add(seq(2, 4)).unwrap();
    let c = s.schedule().unwrap().chunks;
    assert_eq!(c.len(), 3);
    for (k, ch) in c.iter().enumerate() {
        s.running[k].num_computed += ch.len;
        s.running[k].tokens.push(1);
    }
    // Each now needs a second block; only one sequence can keep going.
    let c = s.schedule().unwrap().chunks;
    assert_eq!(c.len(), 1);
    assert_eq!(s.running.len(), 1);
    assert_eq!(s.waiting.len(), 2);
    assert_eq!(
        s.waiting[0].num_computed, 0,
        "preempted sequences recompute"
    );
    for r in s.running.iter_mut() {
        r.finished = Some(FinishReason::Length);
    }
    s.reap_finished().unwrap();
    assert_eq!(s.pool.num_free(), 3);
}

#[test]
fn long_prompts_wait_apart_and_short_ones_keep_their_turn() {
    let cfg = SchedulerConfig {
        max_batched_tokens: 64,
        max_prefill_chunk: 64,
        max_num_seqs: 8,
        block_size: 4,
        long_prefill_threshold: 100,
        max_long_partial_prefills: 1,
        long_prefill_token_cap: 16,
        max_queued_requests: 4,
    };
    let mut s = Scheduler::new(cfg, 256, PrefixSettings::default()).unwrap();
    s.add(seq(0, 300)).unwrap();
    s.add(seq(1, 200)).unwrap();
    s.add(seq(2, 10)).unwrap();
    assert_eq!(s.num_waiting_long(), 2);
    // The short request is admitted first; only one long prompt prefills, capped at 16.
    let c = s.schedule().unwrap().chunks;
    let lens: Vec<(u64, usize)> = c.iter().map(|c| (s.running[c.index].id, c.len)).collect();
    assert_eq!(lens, vec![(2, 10), (0, 16)]);
    for ch in &c {
        s.running[ch.index].num_computed += ch.len;
    }
    assert_eq!(
        s.num_waiting_long(),
        1,
        "the second long prompt waits its turn"
    );
    // Alone (the short one finished), the long prompt takes the whole budget.
    s.running.retain(|q| q.id == 0);
    let c = s.schedule().unwrap().chunks;
    assert_eq!((c.len(), c[0].len), (1, 64));
    // A full queue refuses at once.
    s.add(seq(3, 5)).unwrap();
    s.add(seq(4, 5)).unwrap();
    s.add(seq(5, 5)).unwrap();
    let err = s.add(seq(6, 5)).unwrap_err().to_string();
    assert!(err.contains("queue is full"), "{err}");
}

#[test]
fn absurd_slot_counts_are_refused() {
    let cfg = SchedulerConfig {
        max_num_seqs: MAX_NUM_SEQS + 1,
        ..Default::default()
    };
    let err = Scheduler::new(cfg, 4, PrefixSettings::default())
        .err()
        .unwrap();
    assert!(err.to_string().contains("--max-num-seqs"), "{err}");
}
