//! The real tch trainer learns: a seeded short run's loss falls by at least half.

use crate::util::Sandbox;

#[test]
fn loss_falls_by_half_between_the_first_and_last_tenth_of_a_seeded_run() {
    let sb = Sandbox::new();
    let file = sb.scenario("learn", r#"{ "train": { "steps": 120, "seed": 7 } }"#);
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let losses: Vec<f64> =
        run.rank(0)["losses"].as_array().unwrap().iter().map(|p| p[1].as_f64().unwrap()).collect();
    assert_eq!(losses.len(), 120, "every step's loss is recorded");
    let tenth = losses.len() / 10;
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    let first = mean(&losses[..tenth]);
    let last = mean(&losses[losses.len() - tenth..]);
    assert!(last <= 0.5 * first, "loss fell from {first:.4} to {last:.4}, less than half");
}

#[test]
fn the_same_seed_gives_the_same_loss_curve() {
    let sb = Sandbox::new();
    let file = sb.scenario("seeded", &crate::util::tiny(""));
    let losses = |run: &crate::util::RunOutput| run.rank(0)["losses"].clone();
    let a = sb.run(&[&file], &[]);
    let b = sb.run(&[&file], &[]);
    let c = sb.run(&[&file], &["--set", "train.seed=1"]);
    assert_eq!(losses(&a), losses(&b));
    assert_ne!(losses(&a), losses(&c));
}
