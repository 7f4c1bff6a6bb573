"""The imitation half: the AR-Actor trained on ALOHA demonstrations and measured.

phase_a.py trains the whole policy on a LeRobot dataset (its options and presets in presets.py, its
batches in data.py, the learning rate in schedule.py, a run's files in run_files.py); phase_b.py
trains a new action expert on the frozen visual encoder under one condition (learner-only,
the prefix offloaded up to layer k, or a feature cache); evaluate.py runs a trained policy in
closed loop; study.py runs every condition and seed and study_report.py writes the report.
"""
