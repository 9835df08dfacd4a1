"""The chapters' quizzes, one module per chapter: `QUESTIONS`, shown by `widgets.quiz.show_quiz`."""
